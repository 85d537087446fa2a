"""Every window and question the app opens appears over the main window, centred (`gui/window_position.place_over`),
not where the window manager puts new windows (the screen's corner on some)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from PIL import Image

from gui.background import BackgroundJob
from gui.dialogs import ConfirmDialog, Dialogs
from gui.gallery import SampleImage
from gui.windows.closing_window import ClosingWindow
from gui.windows.sample_viewer import SampleViewerWindow
from onetrainer.config import ConceptConfig, SampleConfig
from tests.gui.helpers import pump

GUI = Path(__file__).resolve().parents[2] / "gui"
MAIN_AT = (160, 90)  # away from the screen's corner, where an unplaced window opens under Xvfb


def assert_over_main_window(window, app) -> None:
    """Centred over the main window (within a few pixels: a window may grow once its widgets settle); one larger than
    the main window sits at its top-left corner."""
    window.update()
    x, y, width, height = window.winfo_rootx(), window.winfo_rooty(), window.winfo_width(), window.winfo_height()
    ax, ay, app_width, app_height = app.winfo_rootx(), app.winfo_rooty(), app.winfo_width(), app.winfo_height()
    assert (ax, ay) == MAIN_AT
    for start, size, app_start, app_size in ((x, width, ax, app_width), (y, height, ay, app_height)):
        if size >= app_size:
            assert abs(start - app_start) <= 2, (window.title(), x, y, width, height)
        else:
            assert abs(start + size / 2 - (app_start + app_size / 2)) <= 40, (window.title(), x, y, width, height)


@pytest.fixture
def moved_app(app):
    app.geometry(f"+{MAIN_AT[0]}+{MAIN_AT[1]}")
    app.update()
    yield app
    app.geometry("+0+0")
    app.update()


def test_windows_open_over_the_main_window(moved_app, tmp_path: Path) -> None:
    app = moved_app
    app.model.config.concepts = [ConceptConfig(name="cats", path=str(tmp_path))]
    app.model.config.samples = [SampleConfig(prompt="a cat")]
    app.model.replace(app.model.config)
    picture = tmp_path / "0 - a cat" / "sample.png"
    picture.parent.mkdir()
    Image.new("RGB", (64, 64), "red").save(picture)
    training, tools = app.select_tab("training"), app.select_tab("tools")
    openers = [
        app.open_log,
        lambda: app.dialogs.show_text("Problems in the loaded config", "• a problem"),
        lambda: ClosingWindow(app, "The model is saved first.", lambda: None),
        lambda: app.select_tab("concepts").open(0),
        lambda: app.select_tab("sampling").open_editor(0),
        lambda: SampleViewerWindow(app.select_tab("sampling").page, SampleImage("0 - a cat", 0, "a cat", picture)),
        training.open_optimizer_dialog,
        training.open_scheduler_dialog,
        training.open_timestep_window,
        lambda: tools.open_dataset_tool(str(tmp_path)),
        *(lambda key=key: tools.open_tool(key) for key in ("masks", "captions", "convert", "lora", "sampling")),
    ]
    for open_window in openers:
        window = open_window()
        try:
            assert_over_main_window(window, app)
            # A worker it started (the timestep histogram) ends before the window: none outlives the test.
            pump(app, lambda w=window: not isinstance(getattr(w, "job", None), BackgroundJob) or w.job.done)
        finally:
            getattr(window, "close", window.destroy)()  # a window's own close lets go of the config it follows
    app.update()


@pytest.mark.parametrize(
    "ask",
    [
        lambda dialogs: dialogs.ask_yes_no("Delete concept", "Delete the concept 'cats'?"),
        lambda dialogs: dialogs.ask_string("Save as my preset", "Name of the preset:"),
        lambda dialogs: dialogs.ask_choice("The preset brings its own data", "Replace?", [("Replace", 1)], None),
    ],
    ids=["yes-no", "text", "choice"],
)
def test_questions_open_over_the_main_window(moved_app, ask) -> None:
    app = moved_app
    seen = []

    def answer(tries: int = 200) -> None:
        open_ = [w for w in app.winfo_children() if isinstance(w, ConfirmDialog) and w.winfo_exists()]
        if open_:
            try:
                assert_over_main_window(open_[0], app)
                seen.append("over the main window")
            except AssertionError as e:  # said after the question is answered (raised here, it would wait forever)
                seen.append(e)
            finally:
                open_[0].destroy()  # as its close button does: the question's cancel value
        elif tries:
            app.after(20, lambda: answer(tries - 1))

    app.after(50, answer)
    ask(Dialogs(app))
    assert seen == ["over the main window"]


def test_every_window_class_places_itself() -> None:
    """A new window (a CTkToplevel in gui/) cannot forget: its class calls `place_over` (or inherits one that does)."""
    unplaced = []
    for path in sorted(GUI.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and any(ast.unparse(b).endswith("CTkToplevel") for b in node.bases):
                calls = {ast.unparse(c.func) for c in ast.walk(node) if isinstance(c, ast.Call)}
                if "place_over" not in calls:
                    unplaced.append(f"{path.relative_to(GUI.parent)}: {node.name}")
    assert unplaced == []
