"""GUI test support: a display (the user's, or an Xvfb started here), one shared app window, scripted dialogs,
and fake training functions that emit a realistic event sequence."""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest

from gui.display import NoDisplayError
from gui.display import display as virtual_display
from onetrainer.config import ConceptConfig, SampleConfig, TrainConfig
from onetrainer.config.enums import ModelFormat, TrainingMethod
from onetrainer.training.control import TrainingControl
from onetrainer.training.events import (
    CacheProgress,
    EventSink,
    Failed,
    Finished,
    Metrics,
    Progress,
    SampleReady,
    Started,
    Status,
)
from tests.gui.helpers import pump

REPO = Path(__file__).resolve().parents[2]
SCREENSHOT_DIR = REPO / "test-artifacts" / "screenshots"


# ---------------------------------------------------------------------------------------------------------------------
# Display


@pytest.fixture(scope="session")
def display() -> Iterator[str]:
    """A display for Tk: $DISPLAY when set, else an Xvfb started for the session, else every GUI test is skipped."""
    try:
        with virtual_display() as name:
            yield name
    except NoDisplayError as e:
        reason = f"GUI tests skipped: {e}"
        print(reason, file=sys.stderr)
        pytest.skip(reason)


# ---------------------------------------------------------------------------------------------------------------------
# Fake training


class FakeTrainer:
    """A training function with the real one's signature that emits the events a short run would.

    `hold` makes it wait (after the first progress report) until released or asked to stop, so tests can look at
    the footer in the middle of a run. With `caching` entries to cache, it first reports them one by one as the
    trainer does (then the first entry is where `hold` waits), and a stop there ends the run before training. With
    `saving`, a stopped run says it saves its model and waits for that event before it ends (a long final save).
    """

    def __init__(
        self,
        epochs: int = 2,
        steps_per_epoch: int = 3,
        hold: bool = False,
        fail: str | None = None,
        caching: int = 0,
        saving: threading.Event | None = None,
    ) -> None:
        self.caching = caching
        self.saving = saving
        self.epochs = epochs
        self.steps_per_epoch = steps_per_epoch
        self.hold = hold
        self.fail = fail
        self.release = threading.Event()
        self.control: TrainingControl | None = None
        self.config: TrainConfig | None = None
        self.thread_name = ""
        self.commands: list[str] = []

    def __call__(self, config: TrainConfig, control: TrainingControl, sinks: list[EventSink]) -> Finished | Failed:
        self.config, self.control = config, control
        self.thread_name = threading.current_thread().name

        def emit(event) -> None:
            for sink in sinks:
                sink.emit(event)

        for done in range(self.caching + 1 if self.caching else 0):
            emit(CacheProgress("latents", done, self.caching, seconds=2.0 * done))
            if done == 1 and self.hold:
                self._wait(control)
            if control.stop_requested:
                outcome = Finished("stopped during caching")
                emit(outcome)
                return outcome
        total = self.epochs * self.steps_per_epoch
        emit(Started("fake-run", total, self.epochs, self.steps_per_epoch, log_path="/tmp/fake-run.log"))
        emit(Status("caching latents"))
        step = 0
        for epoch in range(self.epochs):
            for epoch_step in range(1, self.steps_per_epoch + 1):
                step += 1
                remaining = (total - step) / 4.0
                emit(Progress(step, total, epoch, self.epochs, epoch_step, self.steps_per_epoch, 4.0, remaining))
                emit(Metrics(step, 0.5 / step, 0.6 / step, {"lr": 1e-4}))
                for command in ("sample", "save", "backup"):
                    if control.take(command):
                        self.commands.append(command)
                if self.hold:
                    self._wait(control)
                if control.stop_requested:
                    if self.saving is not None:
                        emit(Status("saving the model"))
                        self.saving.wait(30)
                    outcome: Finished | Failed = Finished("stopped", "", step)
                    emit(outcome)
                    return outcome
            emit(SampleReady(step, 0, "a prompt", f"/tmp/sample-{step}.jpg"))
        if self.fail:
            outcome = Failed(self.fail, "Traceback: fake", "/tmp/fake-run.log")
        else:
            outcome = Finished("completed", "/tmp/model.safetensors", step)
        emit(outcome)
        return outcome

    def _wait(self, control: TrainingControl) -> None:
        """The hold: until released or asked to stop (once per run), taking commands meanwhile."""
        self.hold = False
        deadline = time.monotonic() + 300  # only a guard: the test releases it
        while not self.release.is_set() and not control.stop_requested and time.monotonic() < deadline:
            time.sleep(0.01)
            for command in ("sample", "save", "backup"):
                if control.take(command):
                    self.commands.append(command)


# ---------------------------------------------------------------------------------------------------------------------
# The app


def trainable_config(tmp: Path) -> TrainConfig:
    """A config that passes the run checks once the SD family counts as trainable (see `trainable_sd`)."""
    config = TrainConfig()
    config.training_method = TrainingMethod.LORA
    config.base_model_name = "tiny:sd15"
    config.output_model_format = ModelFormat.KOHYA_LORA
    config.output_model_destination = str(tmp / "out" / "lora.safetensors")
    config.workspace_dir = str(tmp / "workspace")
    config.cache_dir = str(tmp / "cache")
    config.concept_file_name = str(tmp / "concepts.json")
    config.sample_definition_file_name = str(tmp / "samples.json")
    config.concepts = [ConceptConfig(name="shapes", path="tiny:images", seed=1)]
    config.samples = [SampleConfig(prompt="a red circle", width=64, height=64)]
    return config


def default_config(tmp: Path) -> TrainConfig:
    """The defaults, with side files pointing into a temporary folder (never the checkout's)."""
    config = TrainConfig()
    config.concept_file_name = str(tmp / "concepts.json")
    config.sample_definition_file_name = str(tmp / "samples.json")
    return config


@pytest.fixture
def trainable_sd(monkeypatch: pytest.MonkeyPatch) -> None:
    """Until the SD family lands, make it count as trainable (the fake trainer never loads it)."""
    from onetrainer import families

    if "sd" not in families.FAMILY_CLASSES:
        monkeypatch.setitem(families.FAMILY_CLASSES, "sd", "never.loaded:ByTheFakeTrainer")


@pytest.fixture
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The app's autosave folder for this test (never the user's ~/.config)."""
    path = tmp_path / "state"
    monkeypatch.setenv("ONETRAINER_STATE_DIR", str(path))
    return path


def make_scripted_dialogs():
    from gui.dialogs import Dialogs

    class ScriptedDialogs(Dialogs):
        """Blocking questions answered from `answers` (in order); messages stay real windows."""

        def __init__(self, parent) -> None:
            super().__init__(parent)
            self.answers: list = []
            self.asked: list[str] = []
            self.initials: list[str] = []  # the `initial` value each file dialog was given

        def _answer(self, question: str, default):
            self.asked.append(question)
            return self.answers.pop(0) if self.answers else default

        def open_file(self, title, filetypes=(), initial=""):
            self.initials.append(initial)
            return self._answer(f"open file: {title}", "")

        def open_dir(self, title, initial=""):
            self.initials.append(initial)
            return self._answer(f"open dir: {title}", "")

        def save_file(self, title, default_ext=".json", filetypes=(), initial=""):
            self.initials.append(initial)
            return self._answer(f"save file: {title}", "")

        def ask_yes_no(self, title, text):
            return self._answer(f"yes/no: {title}: {text}", False)

        def ask_choice(self, title, text, buttons, cancel):
            return self._answer(f"choice: {title}: {text}", cancel)

        def ask_save_changes(self, title, text):
            return self._answer(f"save changes: {title}: {text}", "discard")

        def ask_string(self, title, text):
            return self._answer(f"text: {title}: {text}", "")

        def close_windows(self) -> None:
            for window in self.windows:
                if window.winfo_exists():
                    window.destroy()
            self.windows = []

    return ScriptedDialogs


class FakeTensorBoard:
    """A TensorBoard server that serves at once, without a process: records what it was started on."""

    started: ClassVar[list[FakeTensorBoard]] = []

    def __init__(self, log_dir: Path, port: int) -> None:
        self.log_dir, self.port = Path(log_dir), port
        self.running = False
        self.checks = 0

    @property
    def url(self) -> str:
        return f"http://localhost:{self.port}/"

    def start(self, wait_seconds: float = 0.0) -> str:
        self.running = True
        FakeTensorBoard.started.append(self)
        return f"TensorBoard: {self.url}"

    def wait_until_serving(self, timeout: float) -> bool:
        self.checks += 1
        return self.running and self.checks > 1  # serving from the second look on, as a real one takes a moment

    def stop(self) -> None:
        self.running = False


class OpenedUrls(list):
    def __call__(self, url: str) -> bool:
        self.append(url)
        return True


@pytest.fixture(scope="session")
def shared_app(display: str, tmp_path_factory: pytest.TempPathFactory):
    """One window for the session; tests reset it with the `app` fixture (building windows is the slow part)."""
    import customtkinter as ctk

    from gui.app import App

    ctk.set_appearance_mode("dark")
    tmp = tmp_path_factory.mktemp("app")
    app = App(
        default_config(tmp),
        train_function=FakeTrainer(),
        dialogs=make_scripted_dialogs(),
        autosave=False,
        open_url=OpenedUrls(),
        tensorboard_server=FakeTensorBoard,
    )
    app.update()
    yield app
    if app.winfo_exists():
        app.destroy()


@pytest.fixture
def app(shared_app, tmp_path: Path):
    """The shared window with a fresh default config, the general tab selected and no dialog history."""
    shared_app.dialogs.close_windows()
    shared_app.dialogs.history.clear()
    shared_app.dialogs.answers.clear()
    shared_app.dialogs.asked.clear()
    shared_app.runner.train_function = FakeTrainer()
    shared_app.gallery.clear()
    if shared_app.tensorboard is not None:
        shared_app.tensorboard.stop()
        shared_app.tensorboard = None
    FakeTensorBoard.started.clear()
    shared_app.model.replace(default_config(tmp_path))
    shared_app.select_tab("general")
    shared_app.footer.set_status("Ready.")
    shared_app.update()
    yield shared_app
    if shared_app.runner.is_alive():
        shared_app.stop()
        shared_app.runner.join(10)
    # A run that ended by itself may still have events queued for the next poll (its last sample, its outcome):
    # handled here, they cannot land in the next test's window (a sample tile after that test cleared the gallery).
    pump(shared_app, lambda: not shared_app.footer.running)


def save_screenshot(app, name: str) -> Path | None:
    """Save the window as `test-artifacts/screenshots/<name>.png` (ImageMagick's `import`; skipped without it)."""
    SCREENSHOT_DIR.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOT_DIR / f"{name}.png"
    binary = shutil.which("import")
    if binary is None:
        return None
    app.update()
    geometry = f"{app.winfo_width()}x{app.winfo_height()}+{app.winfo_rootx()}+{app.winfo_rooty()}"
    subprocess.run([binary, "-window", "root", "-crop", geometry, "+repage", str(path)], check=True, timeout=30)
    return path


# Helpers handed to the test modules as fixtures (test modules do not import from conftest).


@pytest.fixture
def pump_until():
    return pump


@pytest.fixture
def fake_trainer():
    return FakeTrainer


@pytest.fixture
def screenshot():
    return save_screenshot


@pytest.fixture
def trainable(tmp_path: Path, trainable_sd: None) -> TrainConfig:
    return trainable_config(tmp_path)


@pytest.fixture
def scripted_dialogs():
    return make_scripted_dialogs()
