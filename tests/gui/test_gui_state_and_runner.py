"""The autosave and the trainer thread, without a window (no display needed)."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from gui.runner import TrainingRunner
from gui.state import STATE_DIR_ENV, last_config_path, load_last_config, save_last_config, state_dir
from onetrainer.config import TrainConfig, errors
from onetrainer.config.enums import Optimizer
from onetrainer.training.devices import torch_threads, training_threads
from onetrainer.training.events import Failed, Finished, Metrics, Progress, Started


def test_state_dir_from_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(STATE_DIR_ENV, str(tmp_path / "s"))
    assert state_dir() == tmp_path / "s"
    monkeypatch.delenv(STATE_DIR_ENV)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert state_dir() == tmp_path / "xdg" / "onetrainer"


def test_autosave_round_trip(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(STATE_DIR_ENV, str(tmp_path))
    assert load_last_config() == (None, [])
    config = TrainConfig()
    config.learning_rate = 0.000123
    config.optimizer.optimizer = Optimizer.PRODIGY
    path = save_last_config(config)
    assert path == last_config_path() and path.is_file()
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]  # written atomically
    restored, problems = load_last_config()
    assert errors(problems) == []  # (Prodigy with this learning rate earns a warning)
    assert restored is not None and restored.to_dict() == config.to_dict()


def test_a_broken_autosave_is_reported_not_raised(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(STATE_DIR_ENV, str(tmp_path))
    last_config_path().write_text("{not json", encoding="utf-8")
    config, problems = load_last_config()
    assert config is None and "could not be restored" in problems[0].message


def _wait(runner: TrainingRunner) -> None:
    assert runner.join(60)


def test_runner_streams_events_from_a_thread() -> None:
    seen: dict[str, object] = {}

    def train(config, control, sinks):
        import torch

        seen["thread"] = threading.current_thread().name
        seen["threads"] = torch.get_num_threads()
        seen["same_config"] = config
        for sink in sinks:
            sink.emit(Started("run", 2, 1, 2))
            sink.emit(Progress(1, 2, 0, 1, 1, 2, 3.0, 0.3))
            sink.emit(Metrics(1, 0.25, 0.25))
        outcome = Finished("completed")
        for sink in sinks:
            sink.emit(outcome)
        return outcome

    runner = TrainingRunner(train)
    config = TrainConfig()
    # Another count in this thread than the runner's (the tests run with `training_threads`, tests/conftest.py): the
    # trainer thread's count below is the one the runner sets.
    with torch_threads(training_threads() + 1):
        runner.start(config)
        _wait(runner)
    events = runner.drain()
    assert [type(e) for e in events] == [Started, Progress, Metrics, Finished]
    assert runner.outcome == Finished("completed")
    assert seen["thread"] != threading.current_thread().name
    assert seen["threads"] == training_threads() == max(1, (os.cpu_count() or 1) - 1)
    assert seen["same_config"] is config


def test_runner_turns_an_exception_into_failed() -> None:
    def train(config, control, sinks):
        raise ValueError("boom")

    runner = TrainingRunner(train, limit_threads=False)
    runner.start(TrainConfig())
    _wait(runner)
    (event,) = runner.drain()
    assert isinstance(event, Failed) and "boom" in event.message and "ValueError" in event.traceback
    assert runner.outcome == event


def test_runner_commands_reach_the_trainer() -> None:
    taken: list[str] = []

    all_taken = threading.Event()

    def train(config, control, sinks):
        while not control.stop_requested:
            for command in ("sample", "save", "backup"):
                if control.take(command):
                    taken.append(command)
            if len(taken) == 3:
                all_taken.set()
            time.sleep(0.005)
        return Finished("stopped")

    runner = TrainingRunner(train, limit_threads=False)
    runner.start(TrainConfig())
    with pytest.raises(RuntimeError):
        runner.start(TrainConfig())
    runner.request_sample()
    runner.request_save()
    runner.request_backup()
    all_taken.wait(60)  # the trainer takes commands at its own pace (a busy machine may be slow to run its thread)
    runner.request_stop()
    _wait(runner)
    assert sorted(taken) == ["backup", "sample", "save"]
    assert runner.outcome == Finished("stopped")


def test_the_window_never_needs_torch_to_open() -> None:
    # The GUI package imports no torch at import time (the trainer thread does, when a run starts).
    import subprocess
    import sys

    code = "import sys, gui.app; print('torch' in sys.modules)"
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().lower()) is False
