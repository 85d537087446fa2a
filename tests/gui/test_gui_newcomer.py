"""What a newcomer hit (issue 16), clicked and typed in a real window: invalid fields, a form that keeps still,
presets that keep the user's data, a footer that tells the truth, messages that name what the user named."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.gui.helpers import press, settle, view_of

pytestmark = pytest.mark.gui

XDOTOOL = shutil.which("xdotool")


def _type_into(app, view, text: str) -> None:
    """Click into the entry, select what it holds and type `text` over it, key by key (xdotool when installed)."""
    entry = view.entry._entry
    if XDOTOOL is not None:
        app.lift()
        app.update()
        x = entry.winfo_rootx() + entry.winfo_width() // 2
        y = entry.winfo_rooty() + entry.winfo_height() // 2
        subprocess.run([XDOTOOL, "mousemove", str(x), str(y), "click", "1"], check=True, timeout=10)
        settle(app, 0.1)
        subprocess.run([XDOTOOL, "key", "ctrl+a", "BackSpace"], check=True, timeout=10)
        if text:
            subprocess.run([XDOTOOL, "type", "--delay", "10", "--", text], check=True, timeout=10)
        settle(app, 0.2)
    else:
        view.set_text(text)
    assert view.var.get() == text


# -- 1. Start and Save refuse while a field is invalid -------------------------------------------------------------


def test_start_and_save_refuse_while_a_field_holds_an_invalid_value(app, trainable, tmp_path: Path) -> None:
    app.model.replace(trainable)
    learning_rate = view_of(app, "training", "learning_rate")
    epochs = view_of(app, "training", "epochs")
    batch_size = view_of(app, "training", "batch_size")
    _type_into(app, learning_rate, "abc")
    _type_into(app, epochs, "-3")
    _type_into(app, batch_size, "-3")
    config = app.model.config
    assert config.epochs == trainable.epochs and config.batch_size == trainable.batch_size  # never written

    assert app.start() is False
    assert not app.runner.is_alive() and app.runner.train_function.config is None
    text = app.dialogs.history[-1].text
    for label in ("Learning rate", "Epochs", "Batch size"):
        assert label in text, text
    assert "3 problem(s)" in app.footer.status

    target = tmp_path / "saved.json"
    assert app.save_config_file(target) is None
    assert not target.exists()
    assert app.dialogs.history[-1].title == "Cannot save the config" and "Learning rate" in app.dialogs.history[-1].text

    # Fixed: both go ahead.
    _type_into(app, learning_rate, "0.0003")
    _type_into(app, epochs, "2")
    _type_into(app, batch_size, "1")
    assert app.model.input_errors() == []
    assert app.save_config_file(target) == target and target.exists()


def test_backspacing_a_learning_rate_does_not_train_at_zero(app, trainable) -> None:
    app.model.replace(trainable)
    view = view_of(app, "training", "learning_rate")
    view.set_text("0.0003")
    entry = view.entry._entry
    entry.icursor("end")
    press(entry, *["<BackSpace>"] * 6)  # 0.000, 0.00, 0.0, 0., 0 (each a valid zero), then empty
    assert view.var.get() == ""
    assert app.start() is False
    assert "Learning rate" in app.dialogs.history[-1].text and not app.runner.is_alive()


def test_the_sample_editor_marks_what_the_samples_row_marks(app, trainable) -> None:
    app.model.replace(trainable)
    tab = app.select_tab("sampling")
    window = tab.open_editor(0)
    window.update()
    width = window.form.view("samples.0.width")
    _type_into(window, width, "70")
    app.validate_now()
    window.update()
    assert tab.editor.view(0, "width").error  # the row
    assert width.error and "multiple of 8" in width.error  # and the editor
    assert app.start() is False
    assert "sample 'a red circle' › Width" in app.dialogs.history[-1].text
    window.close()


def test_closed_windows_hold_nothing_back(app, trainable) -> None:
    app.model.replace(trainable)
    window = app.select_tab("sampling").open_editor(0)
    window.update()
    window.form.view("samples.0.seed").set_text("x")
    assert [e.path for e in app.model.input_errors()] == ["samples.0.seed"]
    window.close()
    app.update()
    assert app.model.input_errors() == []


# -- 2. Error text never moves the form ----------------------------------------------------------------------------


def test_an_error_does_not_move_the_fields_below(app, screenshot) -> None:
    learning_rate = view_of(app, "training", "learning_rate")
    form = app.tabs["training"].form
    group = next(g for g in form.groups.values() if g.frame is learning_rate.input.master)
    below = [v for v in form.views.values() if v.visible and v.input.master is group.frame and v is not learning_rate]
    app.update()
    before = {v.path: v.input.winfo_y() for v in below}
    _type_into(app, learning_rate, "abc")
    app.update()
    assert learning_rate.input_error
    assert {v.path: v.input.winfo_y() for v in below} == before
    # The message is in the footer and the tooltip.
    assert "Learning rate" in app.footer.status and "not a number" in app.footer.status
    assert learning_rate.tooltip_text().startswith("⚠")
    screenshot(app, "invalid-field-does-not-move-the-form")
    _type_into(app, learning_rate, "0.0001")
    assert app.footer.status == "Ready."


def test_the_optimizer_dialogs_columns_stay_put_on_an_error(app, screenshot) -> None:
    tab = app.select_tab("training")
    tab.form.button("optimizer.optimizer").invoke()
    dialog = tab.optimizer_dialog
    dialog.update()
    beta1, eps = dialog.views["beta1"], dialog.views["eps"]
    before = [(v.input.winfo_x(), v.input.winfo_y()) for v in (beta1, eps)]
    beta1.set_text("abc")
    dialog.update()
    assert beta1.input_error
    assert [(v.input.winfo_x(), v.input.winfo_y()) for v in (beta1, eps)] == before
    assert "Beta 1" in dialog.problem_line.text and "not a number" in dialog.problem_line.text
    screenshot(dialog, "optimizer-dialog-error")
    dialog.close()
    assert app.model.input_errors() == []  # a closed dialog holds nothing back
