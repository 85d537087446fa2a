"""What a newcomer hit (issue 16), clicked and typed in a real window: invalid fields, a form that keeps still,
presets that keep the user's data, a footer that tells the truth, messages that name what the user named."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from onetrainer.config import ConceptConfig, TrainConfig
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
    assert "3 problems" in app.footer.status

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


# -- 3. Presets keep the user's data; unsaved changes are offered for saving; the user's own presets ---------------


def _menu_entries(menu) -> dict[str, int]:
    return {menu.entrycget(i, "label"): i for i in range(menu.index("end") + 1) if menu.type(i) != "separator"}


def _invoke_preset(app, *labels: str) -> None:
    """Open the Load preset menu and click through its cascades to the preset, as a user does."""
    menu = app.topbar.build_preset_menu()
    for label in labels[:-1]:
        menu = menu.nametowidget(menu.entrycget(_menu_entries(menu)[label], "menu"))
    menu.invoke(_menu_entries(menu)[labels[-1]])
    app.update()


def test_a_preset_after_the_demo_drops_the_demos_data(app) -> None:
    _invoke_preset(app, "demo")
    assert app.model.config.concepts[0].name == "demo shapes" and app.model.config.samples[0].width == 64
    _invoke_preset(app, "sd15", "lora")
    config = app.model.config
    assert config.learning_rate == 0.0003
    # The demo's synthetic concept and 64 px sample were the demo's, not the user's: back to the user's side files.
    assert config.concepts is None and config.samples is None
    assert app.select_tab("concepts").cards == []
    assert not any(q.startswith("choice") for q in app.dialogs.asked)


def test_a_preset_with_its_own_data_asks_before_replacing_the_users(app) -> None:
    tab = app.select_tab("concepts")
    tab.add_button.invoke()
    app.model.set("concepts.0.name", "cats")
    app.model.mark_saved()
    learning_rate = app.model.config.learning_rate
    app.dialogs.answers.append(None)  # Cancel: nothing is loaded
    _invoke_preset(app, "demo")
    assert any("brings its own 1 concept." in q and "your 1 concept with" in q for q in app.dialogs.asked)
    assert app.model.config.learning_rate == learning_rate and [c.name for c in app.model.config.concepts] == ["cats"]
    assert "was not loaded" in app.footer.status
    app.dialogs.answers.append("keep")  # only the settings
    _invoke_preset(app, "demo")
    config = app.model.config
    assert config.learning_rate == 0.001 and [c.name for c in config.concepts] == ["cats"]
    assert config.samples[0].prompt == "a red circle on a blue background"  # the user had no samples: no question

    app.model.set("concepts.0.name", "cats")
    app.model.mark_saved()
    app.dialogs.answers.append("replace")
    _invoke_preset(app, "demo")
    assert [c.name for c in app.model.config.concepts] == ["demo shapes"]


def test_the_users_concept_beside_the_demos_stays_and_the_demos_goes(app) -> None:
    _invoke_preset(app, "demo")
    app.select_tab("concepts").add_button.invoke()  # the user's own concept beside the demo's unedited one
    app.model.set("concepts.1.name", "cats")
    app.model.mark_saved()
    _invoke_preset(app, "sd15", "lora")
    config = app.model.config
    assert [c.name for c in config.concepts] == ["cats"]  # the README: the demo's go, the user's stay
    assert config.samples is None  # the demo's unedited sample was all there was: back to the user's side file
    assert [card.name_label.cget("text") for card in app.select_tab("concepts").cards] == ["cats"]
    assert not any(q.startswith("choice") for q in app.dialogs.asked)

    # An edited item is the user's: it stays too.
    app.dialogs.answers.append("replace")  # the demo's concept replaces "cats"
    _invoke_preset(app, "demo")
    app.model.set("concepts.0.loss_weight", 0.5)
    app.model.mark_saved()
    _invoke_preset(app, "sd15", "lora")
    assert [(c.name, c.loss_weight) for c in app.model.config.concepts] == [("demo shapes", 0.5)]


def test_the_demos_data_is_still_the_demos_after_a_restart(
    display, state_dir: Path, in_tmp: Path, scripted_dialogs
) -> None:
    from gui.app import App

    first = App(TrainConfig(), autosave=True, dialogs=scripted_dialogs)
    try:
        assert first.load_preset("demo")
        # (Not through the concepts tab: its pictures belong to the first Tk root, the session's shared window.)
        first.model.config.concepts.append(ConceptConfig(name="cats", path=str(in_tmp)))
        first.model.changed("concepts")
        first.autosave_now()  # what closing the window does
    finally:
        first.destroy()
    second = App(None, autosave=False, dialogs=scripted_dialogs)
    try:
        assert [c.name for c in second.model.config.concepts] == ["demo shapes", "cats"]
        assert second.load_preset("sd15/lora")
        assert [c.name for c in second.model.config.concepts] == ["cats"]
        assert second.model.config.samples is None
    finally:
        second.destroy()


def test_a_preset_is_refused_while_a_run_trains(app, trainable, fake_trainer, pump_until) -> None:
    app.model.replace(trainable)
    _run_until_loss(app, fake_trainer(hold=True), pump_until)
    _invoke_preset(app, "sd15", "lora")
    assert app.model.config.learning_rate == trainable.learning_rate  # the window still shows what trains
    assert "Cannot load the preset 'sd15/lora' while training runs" in app.footer.status
    assert app.footer.status_level == "error" and app.dialogs.history[-1].title == "Training is running"
    assert app.load_config_file("some.json") is False  # a config file neither
    app.runner.train_function.release.set()
    pump_until(app, lambda: not app.footer.running)
    assert app.load_preset("sd15/lora") and app.model.config.learning_rate == 0.0003


def test_unsaved_changes_are_offered_for_saving(app, tmp_path: Path) -> None:
    for key in app.tabview.keys:  # building and showing every tab is no edit
        app.select_tab(key)
    assert not app.model.unsaved
    view_of(app, "training", "learning_rate").set_text("0.0005")
    assert app.model.unsaved
    app.dialogs.answers.append(None)  # cancel: nothing is replaced
    assert app.load_preset("sd15/lora") is False
    assert app.model.config.learning_rate == 0.0005

    target = tmp_path / "mine.json"
    app.dialogs.answers.extend(["save", str(target)])
    assert app.load_preset("sd15/lora") is True
    assert json.loads(target.read_text())["learning_rate"] == 0.0005
    assert app.model.config.learning_rate == 0.0003 and not app.model.unsaved

    view_of(app, "training", "learning_rate").set_text("0.0006")
    app.dialogs.answers.append(None)
    assert app.load_config_file(target) is False and app.model.config.learning_rate == 0.0006
    app.dialogs.answers.append(None)
    app.close()  # cancelled: the window stays
    assert app.winfo_exists()
    assert sum(q.startswith("save changes:") for q in app.dialogs.asked) == 4


def test_users_save_their_own_presets_and_find_them_in_the_menu(app, state_dir: Path) -> None:
    view_of(app, "training", "learning_rate").set_text("0.00042")
    app.select_tab("concepts").add_button.invoke()
    app.model.set("concepts.0.name", "cats")
    menu = app.topbar.build_preset_menu()
    assert menu.entrycget(_menu_entries(menu)["My presets: none saved yet"], "state") == "disabled"
    app.dialogs.answers.append("styles/fast lora")
    menu.invoke(_menu_entries(menu)["Save current settings as my preset…"])
    path = state_dir / "presets" / "styles" / "fast lora.json"
    saved = json.loads(path.read_text())
    assert saved["learning_rate"] == 0.00042 and saved["concepts"] is None  # settings, not the user's data

    app.dialogs.answers.append("../escape")
    app.save_preset()
    assert app.dialogs.history[-1].title == "Cannot save the preset"

    app.model.mark_saved()
    _invoke_preset(app, "sd15", "lora")
    assert app.model.config.learning_rate == 0.0003
    app.model.mark_saved()
    _invoke_preset(app, "My presets", "styles", "fast lora")
    assert app.model.config.learning_rate == 0.00042
    assert [c.name for c in app.model.config.concepts] == ["cats"]  # kept
    assert "Preset 'styles/fast lora' loaded" in app.footer.status


# -- 7. The footer and status tell the truth -----------------------------------------------------------------------


def _run_until_loss(app, trainer, pump_until) -> None:
    app.runner.train_function = trainer
    assert app.start() is True
    pump_until(app, lambda: app.footer.loss_label.cget("text").startswith("loss 0.5000"))


def test_stop_and_a_preset_reset_the_rate_eta_and_loss(app, trainable, fake_trainer, pump_until) -> None:
    app.model.replace(trainable)
    footer = app.footer
    _run_until_loss(app, fake_trainer(hold=True), pump_until)
    assert footer.speed_label.cget("text") == "4.00 it/s"
    footer.start_button.invoke()  # Stop
    pump_until(app, lambda: not footer.running)
    assert "Finished (stopped)" in footer.status
    assert (footer.speed_label.cget("text"), footer.eta_label.cget("text"), footer.loss_label.cget("text")) == (
        "– it/s",
        "ETA –",
        "loss –",
    )

    app.runner.train_function = fake_trainer()
    assert app.start() is True
    pump_until(app, lambda: not footer.running)
    assert footer.eta_label.cget("text") == "ETA –" and footer.loss_label.cget("text") != "loss –"
    app.load_preset("sd15/lora")
    assert footer.loss_label.cget("text") == "loss –" and footer.epoch_text.cget("text") == "–"


def test_a_validation_that_catches_up_after_a_refusal_keeps_its_line(app, trainable) -> None:
    """The delayed validation of a config change can run after Start refused it (a busy machine): with the same
    problems open, the refusal's line stays as it was, rather than turning into "… left" with nothing fixed."""
    trainable.concepts[0].path = "/no/such/folder"
    trainable.base_model_name = "/no/such/model.safetensors"
    app.model.replace(trainable)
    assert app.start() is False
    refused = app.footer.status
    assert refused.startswith("Cannot start, 2 problems: error: Base model: model not found")
    app.validate_now()  # what the scheduled validation does when it runs late
    assert app.footer.status == refused


def test_a_cannot_start_message_clears_once_fixed(app, trainable, pump_until) -> None:
    trainable.concepts[0].path = "/no/such/folder"
    app.model.replace(trainable)
    learning_rate = view_of(app, "training", "learning_rate")
    learning_rate.set_text("abc")
    assert app.start() is False
    assert app.footer.status.startswith("Cannot start, 2 problems")
    learning_rate.set_text("0.0001")
    assert app.footer.status.startswith("Cannot start, 1 problem left: error: concept 'shapes'")
    # A changed field is not yet a fixed one: the checks run again and still find no folder there.
    app.model.set("concepts.0.path", "/no/other/folder")
    pump_until(app, lambda: "/no/other/folder" in app.footer.status)
    assert app.footer.status.startswith("Cannot start, 1 problem left: error: concept 'shapes'")
    assert "fixed" not in app.footer.status and app.footer.status_level == "error"
    app.model.set("concepts.0.path", "tiny:images")
    pump_until(app, lambda: not app.footer.status.startswith("Cannot start"))
    assert app.footer.status.startswith("Checked again: the problems that stopped the start are fixed")
    assert app.footer.status_level == "ok"
    assert app.start() is True


def test_a_long_start_refusal_keeps_the_footer_one_line_high(app, trainable, screenshot) -> None:
    app.geometry("1024x700")
    settle(app, 0.5)
    trainable.concepts[0].path = "/no/such/folder"
    trainable.base_model_name = "/no/such/model.safetensors"
    app.model.replace(trainable)
    footer = app.footer
    settle(app, 0.3)
    before = (footer.epoch_bar.winfo_rooty(), footer.winfo_height())
    assert app.start() is False
    settle(app, 0.3)
    assert (footer.epoch_bar.winfo_rooty(), footer.winfo_height()) == before  # the progress row did not move
    assert footer.status.startswith("Cannot start, 2 problems: error: Base model: model not found")
    assert footer.status.endswith("(and 1 more; see Log)")
    shown = footer.status_shown
    assert "\n" not in shown and shown.endswith("… (and 1 more; see Log)")
    assert footer.status_tooltip.text == footer.status  # the whole text on hover
    assert footer.status_label.winfo_reqwidth() <= footer.winfo_width()
    # The whole list, one problem a line: in the dialog and in the Log window.
    dialog = app.dialogs.history[-1].text
    assert dialog.startswith("Fix these 2 problems first:\n\n• error: Base model: model not found")
    assert "\n• error: concept 'shapes': folder not found: /no/such/folder" in dialog
    assert any(line.startswith("• error: concept 'shapes'") for line in app.log.text.splitlines())
    screenshot(app, "footer-start-refused")

    trainable.base_model_name = "tiny:sd15"
    app.model.replace(trainable)
    assert app.start() is False
    assert app.dialogs.history[-1].text.startswith("Fix this problem first:")
    assert app.footer.status.startswith("Cannot start, 1 problem: error: concept 'shapes'")
    footer.add_warning("no CUDA device: training on the CPU, much slower (train device 'cuda'); " * 4)
    footer.add_warning("a second warning that is long enough to need shortening at this width, " * 4)
    settle(app, 0.3)
    assert (footer.epoch_bar.winfo_rooty(), footer.winfo_height()) == before  # warnings keep the height too
    assert footer.notice_label.cget("text").endswith("… (+1 more, see Log)")
    app.geometry("1280x800")


def test_the_footer_is_not_clipped_at_1024_px(app, trainable, fake_trainer, pump_until, screenshot) -> None:
    app.geometry("1024x700")
    settle(app, 0.5)
    app.model.replace(trainable)
    _run_until_loss(app, fake_trainer(hold=True), pump_until)
    footer = app.footer
    footer.set_status(
        "Sample ready (step 12): 2026-11-23_21-30-00-sample-0-a red circle on a blue background.jpg, and more words "
        "so that the line is longer than the window is wide at 1024 pixels, which used to cut it off at the buttons",
        "warning",
    )
    footer.add_warning("no CUDA device: training on the CPU, much slower (train device 'cuda')")
    settle(app, 0.5)
    width = footer.winfo_width()
    assert width <= 1024
    for widget in (footer.status_label, footer.notice_label, footer.buttons, footer.loss_label, footer.queue_frame):
        right = widget.winfo_rootx() - footer.winfo_rootx() + widget.winfo_width()
        assert right <= width, widget
        assert widget.winfo_width() >= widget.winfo_reqwidth() - 1, widget  # got the room it asked for
    screenshot(app, "footer-at-1024")
    app.runner.train_function.release.set()


def test_the_cpu_fallback_shows_in_the_app(app, trainable, pump_until, monkeypatch) -> None:
    import torch

    from onetrainer.training.devices import select_device
    from onetrainer.training.events import Finished, Started, Status, Warning_

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)

    def train(config, control, sinks):
        def emit(event):
            for sink in sinks:
                sink.emit(event)

        select_device("cuda", lambda text: emit(Warning_(text)))
        emit(Started("cpu-run", 1, 1, 1))
        emit(Status("caching latents"))
        emit(Status("caching text"))
        outcome = Finished("completed", "/tmp/x.safetensors", 1)
        emit(outcome)
        return outcome

    app.runner.train_function = train
    app.model.replace(trainable)
    assert app.start()
    pump_until(app, lambda: not app.footer.running)
    assert "no CUDA device: training on the CPU, much slower" in app.footer.notice  # still shown at the end
    app.open_log()
    app.log_window.update()
    assert "warning: no CUDA device: training on the CPU, much slower" in app.log_window.text
    app.log_window.destroy()


def test_the_tensorboard_button_starts_tensorboard_and_reports_a_browser_failure(app, pump_until) -> None:
    from tests.gui.conftest import FakeTensorBoard

    workspace = app.model.config.workspace_dir
    app.footer.tensorboard_button.invoke()
    assert [s.log_dir for s in FakeTensorBoard.started] == [Path(workspace) / "tensorboard"]
    pump_until(app, lambda: app._open_url and app._open_url[-1] == "http://localhost:6006/")
    assert "opened http://localhost:6006/" in app.footer.status
    app.footer.tensorboard_button.invoke()  # running: reused
    assert len(FakeTensorBoard.started) == 1

    opener = app._open_url
    app._open_url = lambda url: False  # no browser
    try:
        app.footer.tensorboard_button.invoke()
    finally:
        app._open_url = opener
    assert app.footer.status_level == "error" and "no web browser could be opened" in app.footer.status


def test_sample_now_is_disabled_when_idle(app, trainable, fake_trainer, pump_until) -> None:
    gallery_button = app.select_tab("sampling").gallery.sample_now_button
    assert app.footer.sample_button.cget("state") == "disabled" and gallery_button.cget("state") == "disabled"
    app.model.replace(trainable)
    _run_until_loss(app, fake_trainer(hold=True), pump_until)
    assert app.footer.sample_button.cget("state") == "normal" and gallery_button.cget("state") == "normal"
    app.stop()
    pump_until(app, lambda: not app.footer.running)
    assert gallery_button.cget("state") == "disabled"


def test_the_log_window_shows_what_the_console_shows(app, trainable, fake_trainer, pump_until) -> None:
    import logging

    app.model.replace(trainable)
    app.footer.log_button.invoke()
    window = app.log_window
    app.runner.train_function = fake_trainer()
    assert app.start() is True
    logging.getLogger("some.library").warning("a library's warning")
    pump_until(app, lambda: not app.footer.running)
    start = app.log.total
    pump_until(app, lambda: window._shown == start)  # the window caught up
    run = window.text[window.text.rindex("Training fake-run") :]
    for line in ("caching latents", "epoch 1/2 done", "epoch 2/2 done", "Finished (completed)"):
        assert line in run
    assert "WARNING some.library: a library's warning" in window.text
    window.destroy()


def test_started_from_a_terminal_the_terminal_shows_progress(
    display, state_dir, trainable, fake_trainer, pump_until, scripted_dialogs
) -> None:
    import io

    from gui.app import App

    terminal = io.StringIO()
    window = App(trainable, train_function=fake_trainer(), dialogs=scripted_dialogs, autosave=False, console=terminal)
    try:
        assert window.start()
        pump_until(window, lambda: not window.footer.running)
        text = terminal.getvalue()
        assert "Training fake-run: 2 epochs x 3 steps" in text and "Finished (completed)" in text
        assert "6/6" in text  # the progress bar
    finally:
        window.destroy()


# -- 8. Messages name what the user named --------------------------------------------------------------------------


def test_a_card_whose_folder_does_not_exist_says_so(app, tmp_path: Path) -> None:
    tab = app.select_tab("concepts")
    tab.add_button.invoke()
    card = tab.cards[0]
    assert card.picture.cget("text") == "no folder chosen"
    app.model.set("concepts.0.path", str(tmp_path / "cats"))
    assert card.picture.cget("text") == "folder not found"
    (tmp_path / "cats").mkdir()
    app.model.set("concepts.0.path", str(tmp_path / "cats") + "/")
    assert card.picture.cget("text") == "no images found"
    app.model.set("concepts.0.name", "cats")
    app.model.set("concepts.0.path", "/no/such/cats")
    app.start()
    assert "concept 'cats': folder not found: /no/such/cats" in app.dialogs.history[-1].text
    assert "concepts.0.path" not in app.dialogs.history[-1].text


# -- 9. Smaller things ----------------------------------------------------------------------------------------------


def test_ctrl_a_selects_everything_in_an_entry(app) -> None:
    view = view_of(app, "training", "learning_rate")
    view.set_text("0.0003")
    entry = view.entry._entry
    entry.icursor(2)
    press(entry, "<Control-a>")
    assert entry.selection_present() and entry.index("sel.first") == 0 and entry.index("sel.last") == len("0.0003")
    press(entry, "<Key-5>")  # typing replaces the selection, as everywhere else
    assert view.var.get() == "5"


def test_deleting_a_concept_asks_first(app) -> None:
    tab = app.select_tab("concepts")
    tab.add_button.invoke()
    app.model.set("concepts.0.name", "cats")
    tab.cards[0].remove_button.invoke()
    assert [c.name for c in app.model.config.concepts] == ["cats"]  # "no"
    assert "Delete the concept 'cats'?" in app.dialogs.asked[-1] and "stay on disk" in app.dialogs.asked[-1]
    app.dialogs.answers.append(True)
    tab.cards[0].remove_button.invoke()
    assert app.model.config.concepts == []


def test_file_dialogs_start_near_the_value_and_hide_dot_folders(app, tmp_path: Path) -> None:
    from gui.dialogs import start_dir

    # Tk's file dialog on Linux lists .git and .venv unless its "show hidden" switch is off.
    if app.tk.call("tk", "windowingsystem") == "x11":
        assert str(app.tk.call("set", "::tk::dialog::file::showHiddenVar")) == "0"
    view = view_of(app, "general", "workspace_dir")
    wanted = tmp_path / "runs" / "new"
    view.set_text(str(wanted))
    view.browse_button.invoke()
    assert app.dialogs.initials[-1] == str(wanted)
    assert start_dir(str(wanted)) == str(tmp_path)  # the nearest folder that exists
    assert start_dir("") == str(Path.home()) and start_dir("tiny:images") == str(Path.home())
    (tmp_path / "cats").mkdir()
    assert start_dir(str(tmp_path / "cats")) == str(tmp_path / "cats")


def test_the_demos_samples_say_a_random_weight_model_draws_noise(app, trainable, pump_until) -> None:
    import time

    from onetrainer.training.events import Finished, SampleReady, Started

    gallery = app.select_tab("sampling").gallery
    assert gallery.note_label.cget("text") == ""  # the defaults' real base model
    app.load_preset("demo")
    assert "random weights" in gallery.note_label.cget("text") and "noise" in gallery.note_label.cget("text")

    def train(config, control, sinks):
        for event in (Started("demo", 1, 1, 1), SampleReady(1, 0, "a red circle", "/tmp/demo-sample.jpg")):
            for sink in sinks:
                sink.emit(event)
        while not control.stop_requested:
            time.sleep(0.01)
        return Finished("stopped", "", 1)

    app.model.replace(trainable)  # tiny:sd15, as the demo
    app.runner.train_function = train
    assert app.start()
    pump_until(app, lambda: "Sample ready" in app.footer.status)
    assert "random weights" in app.footer.status and "noise" in app.footer.status
    app.stop()
    pump_until(app, lambda: not app.footer.running)
    app.model.set("base_model_name", "runwayml/stable-diffusion-v1-5")
    assert gallery.note_label.cget("text") == ""


# -- Questions follow the app's appearance -----------------------------------------------------------------------


def _answer_question(app, label: str, seen: dict, tries: int = 100) -> None:
    """Press `label` in the open question (as a click does), noting its colours; a Tk message box (what the app used
    to open) is closed instead, so the test fails rather than hangs."""
    import gui.dialogs

    kind = getattr(gui.dialogs, "ConfirmDialog", None)
    open_ = [w for w in app.winfo_children() if kind is not None and isinstance(w, kind) and w.winfo_exists()]
    if open_:
        dialog = open_[0]
        seen.setdefault("backgrounds", []).append(dialog.cget("bg"))
        seen.setdefault("texts", []).append(dialog.buttons[label].cget("text"))
        dialog.buttons[label].invoke()
    elif tries:
        app.after(30, lambda: _answer_question(app, label, seen, tries - 1))
    else:
        for child in app.tk.call("winfo", "children", ".") or ():
            if "__tk__messagebox" in str(child):
                app.tk.call("destroy", child)


def test_questions_are_drawn_in_the_apps_dark_appearance(app) -> None:
    import customtkinter as ctk

    from gui.dialogs import Dialogs

    assert ctk.get_appearance_mode() == "Dark"
    dark = ctk.ThemeManager.theme["CTkToplevel"]["fg_color"][1]
    dialogs = Dialogs(app)  # the real questions, not the scripted ones
    seen: dict = {}
    app.after(50, lambda: _answer_question(app, "No", seen))
    assert dialogs.ask_yes_no("Delete concept", "Delete the concept 'cats'?") is False
    app.after(50, lambda: _answer_question(app, "Yes", seen))
    assert dialogs.ask_yes_no("Delete concept", "Delete the concept 'cats'?") is True
    for label, expected in (("Save", "save"), ("Don't save", "discard"), ("Cancel", None)):
        app.after(50, lambda label=label: _answer_question(app, label, seen))
        assert dialogs.ask_save_changes("Unsaved changes", "Save them first?") == expected
    assert seen["backgrounds"] == [dark] * 5 and app.cget("bg") == dark  # the window's own dark, not Tk's grey
