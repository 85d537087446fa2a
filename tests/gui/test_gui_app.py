"""The app in a real Tk window (Xvfb when there is no display): forms, presets, Start, the footer, autosave."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

from gui.forms.fields import ERROR_COLOR, BoolView, ChoiceView, EntryView
from gui.forms.selection import form_fields
from gui.labels import NOT_TRAINABLE_SUFFIX, method_label, model_type_label, offered_methods
from gui.tabs import visible_tabs
from onetrainer.config import ConceptConfig, TrainConfig, load_config, pack
from onetrainer.config.enums import ModelFormat, ModelType, MultiGpuMode, Optimizer, TimeUnit, TrainingMethod
from onetrainer.config.model_types import MODEL_TYPES, SUPPORTED_MODEL_TYPES
from onetrainer.config.naming import describe
from onetrainer.config.validation import context_of
from onetrainer.families import is_trainable
from onetrainer.training.checks import run_checks
from tests.gui.helpers import choose_in_menu, view_of

pytestmark = pytest.mark.gui


# -- generated forms -----------------------------------------------------------------------------------------------


def test_every_tab_builds_for_every_model_type_and_method(app) -> None:
    topbar = app.topbar
    for model_type in SUPPORTED_MODEL_TYPES:
        choose_in_menu(topbar.model_type_menu, model_type_label(model_type))
        assert app.model.config.model_type is model_type
        methods = offered_methods(model_type)
        assert topbar.method_menu.cget("values") == [method_label(m) for m in methods]
        for method in methods:
            choose_in_menu(topbar.method_menu, method_label(method))
            config = app.model.config
            assert config.training_method is method
            ctx = context_of(config)
            assert app.tabview.keys == [t.key for t in visible_tabs(ctx)]
            for key in app.tabview.keys:
                tab = app.select_tab(key)
                app.update_idletasks()
                expected = {f.path for f in form_fields(config, key) if f.applies(ctx)}
                assert set(tab.form.shown_paths()) == expected, (model_type, method, key)
                for path in expected:  # every shown widget holds the config's value
                    view = tab.form.view(path)
                    assert view.input_error is None
                    if isinstance(view, EntryView) and view.is_number:
                        assert view.var.get() != "" or app.model.get(path) is None
    app.update()


def test_lora_and_embedding_tabs_follow_the_method(app) -> None:
    app.topbar.choose_method(TrainingMethod.LORA)
    assert "lora" in app.tabview.keys and "embedding" not in app.tabview.keys
    assert view_of(app, "lora", "lora_rank").var.get() == "16"
    app.topbar.choose_method(TrainingMethod.EMBEDDING)
    assert "lora" not in app.tabview.keys and "embedding" in app.tabview.keys
    assert view_of(app, "embedding", "embedding.placeholder").var.get() == "<embedding>"
    # SDXL's second text encoder brings its own field to the embedding tab, with no family code in the view.
    app.topbar.choose_model_type(ModelType.STABLE_DIFFUSION_XL_10_BASE)
    assert view_of(app, "embedding", "text_encoder_2.train_embedding") is not None
    app.topbar.choose_model_type(ModelType.STABLE_DIFFUSION_15)
    assert app.select_tab("embedding").form.view("text_encoder_2.train_embedding").visible is False


def test_pixart_fields_show_for_pixart_only(app) -> None:
    app.topbar.choose_model_type(ModelType.PIXART_ALPHA)
    assert view_of(app, "training", "vb_loss_strength").var.get() == "1.0"
    assert view_of(app, "model", "transformer.weight_dtype") is not None
    app.topbar.choose_model_type(ModelType.STABLE_DIFFUSION_15)
    assert app.select_tab("training").form.view("vb_loss_strength").visible is False
    app.topbar.choose_model_type(ModelType.PIXART_SIGMA)
    assert view_of(app, "training", "vb_loss_strength") is not None
    app.topbar.choose_model_type(ModelType.STABLE_DIFFUSION_15)


def test_widget_kinds_follow_the_field_types(app) -> None:
    assert isinstance(view_of(app, "general", "only_cache"), BoolView)
    assert isinstance(view_of(app, "training", "optimizer.optimizer"), ChoiceView)
    learning_rate = view_of(app, "training", "learning_rate")
    assert isinstance(learning_rate, EntryView) and learning_rate.is_number
    workspace = view_of(app, "general", "workspace_dir")
    assert workspace.browse_button is not None and not workspace.is_number
    sample_after = view_of(app, "sampling", "sample_after")
    assert sample_after.unit_view is not None and sample_after.unit_view.menu.get() == "MINUTE"
    # The offered choices only, from the metadata.
    output_dtype = view_of(app, "model", "output_dtype")
    assert output_dtype.menu.cget("values") == ["FLOAT_32", "FLOAT_16", "BFLOAT_16"]
    # The tooltip shows the help text.
    assert learning_rate.tooltip_text().startswith(TrainConfig.spec("learning_rate").meta.help)


def test_the_multi_gpu_mode_and_shard_offload_are_shown_beside_multi_gpu(app) -> None:
    """Our sharded and split modes (OneTrainer has neither) sit in the Device group with Multi-GPU, a choice of the
    three modes, with the split's devices beside them."""
    group = TrainConfig.spec("multi_gpu").meta.group
    for name in ("multi_gpu_mode", "sharded_cpu_offload"):
        assert TrainConfig.spec(name).meta.group == group
    mode = view_of(app, "general", "multi_gpu_mode")
    assert isinstance(mode, ChoiceView) and mode.menu.cget("values") == ["DATA_PARALLEL", "SHARDED", "MODEL_SPLIT"]
    assert TrainConfig.spec("split_devices").meta.group == group
    split = view_of(app, "general", "split_devices")
    split.set_text("cuda:0,cuda:1")
    assert app.model.config.split_devices == "cuda:0,cuda:1"
    choose_in_menu(mode.menu, "MODEL_SPLIT")
    assert app.model.config.multi_gpu_mode is MultiGpuMode.MODEL_SPLIT
    choose_in_menu(mode.menu, "SHARDED")
    assert app.model.config.multi_gpu_mode is MultiGpuMode.SHARDED
    offload = view_of(app, "general", "sharded_cpu_offload")
    assert isinstance(offload, BoolView)
    offload.switch.toggle()
    assert app.model.config.sharded_cpu_offload is True
    offload.switch.toggle()
    choose_in_menu(mode.menu, "DATA_PARALLEL")


def test_typing_toggling_and_choosing_change_the_config(app) -> None:
    config = app.model.config
    learning_rate = view_of(app, "training", "learning_rate")
    learning_rate.entry.delete(0, "end")
    learning_rate.entry.insert(0, "0.0004")
    assert config.learning_rate == 0.0004
    workspace = view_of(app, "general", "workspace_dir")
    workspace.set_text("/tmp/my-run")
    assert config.workspace_dir == "/tmp/my-run"

    only_cache = view_of(app, "general", "only_cache")
    only_cache.switch.toggle()
    assert config.only_cache is True
    only_cache.switch.toggle()
    assert config.only_cache is False

    optimizer = view_of(app, "training", "optimizer.optimizer")
    choose_in_menu(optimizer.menu, "PRODIGY")
    assert config.optimizer.optimizer is Optimizer.PRODIGY

    sample_after = view_of(app, "sampling", "sample_after")
    sample_after.set_text("3")
    choose_in_menu(sample_after.unit_view.menu, "EPOCH")
    assert (config.sample_after, config.sample_after_unit) == (3, TimeUnit.EPOCH)

    # A part's field writes into its block.
    unet_lr = view_of(app, "training", "unet.learning_rate")
    unet_lr.set_text("1e-4")
    assert config.unet.learning_rate == 1e-4
    unet_lr.set_text("")  # float_or_empty: empty means "use the base learning rate"
    assert config.unet.learning_rate is None


def test_an_invalid_number_is_marked_and_not_written(app) -> None:
    config = app.model.config
    view = view_of(app, "training", "learning_rate")
    before = config.learning_rate
    view.set_text("1e-4x")
    app.update_idletasks()
    assert config.learning_rate == before
    assert view.input_error and "not a number" in view.input_error
    assert view.entry.cget("border_color") == ERROR_COLOR
    assert "not a number" in app.footer.status  # the status line, not a line that would move the form
    assert view.tooltip_text().startswith("⚠")

    factor = view_of(app, "training", "learning_rate_min_factor")
    factor.set_text("2")
    assert config.learning_rate_min_factor == 0.0 and "out of range" in factor.input_error
    epochs = view_of(app, "training", "epochs")
    epochs.set_text("2.5")
    assert config.epochs == 100 and "whole number" in epochs.input_error
    epochs.set_text("")
    assert config.epochs == 100 and epochs.input_error == "needs a value"

    view.set_text("0.0002")  # fixed: written and unmarked
    app.update_idletasks()
    assert config.learning_rate == 0.0002 and view.error is None
    assert view.entry.cget("border_color") != ERROR_COLOR
    assert "learning_rate" not in [e.path for e in app.model.input_errors()]


def test_cross_field_problems_are_marked(app) -> None:
    app.topbar.choose_method(TrainingMethod.LORA)
    app.validate_now()
    view = view_of(app, "model", "output_model_format")
    assert view.error and "does not fit" in view.error  # ORIGINAL_SINGLE_FILE is no LoRA format
    choose_in_menu(view.menu, "KOHYA_LORA")
    app.validate_now()
    assert view.error is None


def test_loading_a_preset_updates_the_widgets(app) -> None:
    learning_rate = view_of(app, "training", "learning_rate")
    assert learning_rate.var.get() == "3e-06"
    # Through the menu a user opens: folders are cascades.
    menu = app.topbar.build_preset_menu()
    entries = {menu.entrycget(i, "label"): i for i in range(menu.index("end") + 1) if menu.type(i) != "separator"}
    assert menu.type(entries["demo"]) == "command" and menu.type(entries["sd15"]) == "cascade"
    sd15 = menu.nametowidget(menu.entrycget(entries["sd15"], "menu"))
    names = [sd15.entrycget(i, "label") for i in range(sd15.index("end") + 1)]
    sd15.invoke(names.index("lora"))
    app.update()

    config = app.model.config
    assert config.training_method is TrainingMethod.LORA and config.learning_rate == 0.0003
    assert app.topbar.method_menu.get() == "LoRA"
    assert app.topbar.model_type_menu.get() == model_type_label(ModelType.STABLE_DIFFUSION_15)
    assert learning_rate.var.get() == "0.0003"
    assert view_of(app, "training", "layer_filter_preset").menu.get() == "attn-mlp"
    assert view_of(app, "model", "unet.weight_dtype").menu.get() == "FLOAT_16"
    assert view_of(app, "lora", "lora_alpha").var.get() == "16.0"
    assert "Preset 'sd15/lora' loaded" in app.footer.status

    app.load_preset("wuerstchen/lora")
    assert view_of(app, "model", "prior.weight_dtype").visible
    assert app.select_tab("model").form.view("unet.weight_dtype").visible is False


def test_sample_rows_edit_the_samples(app) -> None:
    app.topbar.choose_model_type(ModelType.STABLE_DIFFUSION_XL_10_BASE)
    editor = app.select_tab("sampling").editor
    assert app.model.config.samples == []  # the default sample file does not exist: an empty list
    app.model.set("resolution", "64")
    editor.add_button.invoke()
    sample = app.model.config.samples[0]
    assert (sample.width, sample.height) == (64, 64)  # the training resolution, not SDXL's 1024 (issue 42)
    editor.view(0, "prompt").set_text("a cat in a hat")
    editor.view(0, "seed").set_text("7")
    editor.view(0, "width").set_text("abc")
    assert (sample.prompt, sample.seed, sample.width) == ("a cat in a hat", 7, 64)
    assert editor.view(0, "width").error
    editor.view(0, "width").set_text("1020")  # valid number, but validation wants a multiple of 8
    app.validate_now()
    assert "multiple of 8" in editor.view(0, "width").error
    # Several sizes: the largest, at the family's sample step; steps, guidance and sampler are the model type's.
    app.topbar.choose_model_type(ModelType.FLUX_DEV_1)
    app.model.set("resolution", "512,768,1000")
    editor.add_button.invoke()
    flux = app.model.config.samples[-1]
    assert (flux.width, flux.height, flux.diffusion_steps, flux.cfg_scale) == (1008, 1008, 28, 3.5)


# -- top bar and config files --------------------------------------------------------------------------------------


def test_not_trainable_model_types_are_marked_in_the_menu(app) -> None:
    values = app.topbar.model_type_menu.cget("values")
    for model_type in SUPPORTED_MODEL_TYPES:
        label = model_type_label(model_type)
        assert label in values and label.endswith(NOT_TRAINABLE_SUFFIX) == (not is_trainable(model_type))
    assert len(values) == len(MODEL_TYPES)


def test_save_load_and_export(app, tmp_path: Path, trainable_sd) -> None:
    config = app.model.config
    config.concepts = [ConceptConfig(name="shapes", path="tiny:images", seed=3)]
    config.base_model_name = "tiny:sd15"
    config.output_model_destination = str(tmp_path / "out.safetensors")
    view_of(app, "training", "learning_rate").set_text("0.005")

    saved = app.save_config_file(tmp_path / "saved.json")
    assert saved and load_config(saved)[0].to_dict() == config.to_dict()
    app.dialogs.answers.append(str(tmp_path / "exported.json"))
    exported = app.export_config()
    assert exported == tmp_path / "exported.json"
    assert app.dialogs.asked[-1].startswith("save file: Export config")
    data = json.loads(exported.read_text(encoding="utf-8"))
    assert data["concepts"][0]["name"] == "shapes" and data["samples"] == []  # inline, packed
    assert data == pack(config)[0].to_dict()
    # The command line takes the exported file unchanged.
    from onetrainer.cli.train import main as train_main

    assert train_main(["--config-path", str(exported), "--check"]) == 0
    assert train_main(["--config-path", str(saved), "--check"]) == 0  # the saved file too, as it is

    # And the other way round: a config made on the command line's layers (preset + --set) loads in the window.
    from onetrainer.config import load_layers, save_config

    cli_config, _ = load_layers("demo", None, ["learning_rate=0.0123", "lora_rank=8"])
    save_config(cli_config, tmp_path / "from-cli.json")
    assert app.load_config_file(tmp_path / "from-cli.json")
    assert view_of(app, "training", "learning_rate").var.get() == "0.0123"
    assert view_of(app, "lora", "lora_rank").var.get() == "8"
    assert app.model.config.to_dict() == cli_config.to_dict()

    app.model.replace(TrainConfig())
    assert app.load_config_file(saved)
    assert app.model.config.learning_rate == 0.005
    assert view_of(app, "training", "learning_rate").var.get() == "0.005"

    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]", encoding="utf-8")
    assert not app.load_config_file(bad)
    assert app.dialogs.history[-1].error and "JSON object" in app.dialogs.history[-1].text


def test_tensorboard_button_opens_the_port(app, pump_until) -> None:
    view_of(app, "general", "tensorboard_port").set_text("6123")
    app.footer.tensorboard_button.invoke()
    pump_until(app, lambda: app._open_url and app._open_url[-1] == "http://localhost:6123/")


# -- Start, the footer, Stop ---------------------------------------------------------------------------------------


def test_start_refuses_a_model_type_that_cannot_train(app, monkeypatch) -> None:
    from onetrainer import families

    # Every family of the menu trains today: one without its module stands for a family still to come.
    monkeypatch.delitem(families.FAMILY_CLASSES, "cascade")
    model_type = ModelType.STABLE_CASCADE_1
    assert not is_trainable(model_type)
    app.topbar.choose_model_type(model_type)
    app.footer.start_button.invoke()
    message = app.dialogs.history[-1]
    assert message.error and "cannot be trained yet" in message.text and MODEL_TYPES[model_type].label in message.text
    assert "cannot be trained yet" in app.footer.status and app.footer.status_level == "error"
    assert not app.runner.is_alive() and app.footer.start_button.cget("text") == "Start training"
    assert app.dialogs.windows and app.dialogs.windows[-1].winfo_exists()  # a real window shows it


def test_a_model_type_this_trainer_does_not_know_is_shown_and_refused(unbuilt_model_type, app, tmp_path: Path) -> None:
    name = unbuilt_model_type.value
    path = tmp_path / "video.json"
    path.write_text(json.dumps({"model_type": name, "training_method": "LORA"}), encoding="utf-8")
    assert app.load_config_file(path)
    assert app.topbar.model_type_menu.get() == f"{name} (not trainable yet)"
    assert "problem" in app.footer.status  # validation reports the model type
    for key in app.tabview.keys:  # the forms still build (the SD 1.5 facts stand in)
        app.select_tab(key)
    assert app.start() is False
    assert f"{name} is a OneTrainer model type this trainer cannot train yet" in app.dialogs.history[-1].text
    assert not app.runner.is_alive()


def test_a_onetrainer_qwen_preset_loads_in_the_window_with_its_memory_settings(app) -> None:
    # OneTrainer's Qwen-Image preset loads with its memory settings kept and its layer filter, and the forms build.
    from tests.conftest import onetrainer_presets_dir

    assert app.load_config_file(onetrainer_presets_dir() / "QwenImage" / "#qwen LoRA 16GB.json")
    assert app.topbar.model_type_menu.get() == model_type_label(ModelType.QWEN)
    assert app.model.config.transformer.offload_fraction == 0.5
    assert app.model.config.quantization.layer_filter == "transformer_block"
    assert app.model.config.layer_filter == "attn,img_mlp,txt_mlp"
    for key in app.tabview.keys:  # the forms build
        app.select_tab(key)
    assert not app.dialogs.history


def test_start_lists_every_problem(app, trainable_sd, screenshot) -> None:
    config = app.model.config
    config.base_model_name = "/no/such/model.safetensors"
    config.concepts = [ConceptConfig(name="missing", path="/no/such/folder")]
    config.output_model_destination = ""
    config.min_noising_strength = 0.9
    config.max_noising_strength = 0.5
    app.model.replace(config)
    expected = [p for p in run_checks(pack(config)[0]) if p.is_error]
    assert len(expected) >= 4
    assert app.start() is False
    message = app.dialogs.history[-1]
    for problem in expected:
        assert describe(problem, config) in message.text
    # Named as the user named them, not by path (concepts.0.path).
    assert "concept 'missing': folder not found: /no/such/folder" in message.text
    assert "Output destination: no output destination given" in message.text
    assert f"{len(expected)} problem" in app.footer.status and app.footer.status_level == "error"
    assert not app.runner.is_alive()
    # The fields with problems are marked.
    assert view_of(app, "model", "base_model_name").error
    assert "/no/such/folder" in app.select_tab("concepts").cards[0].problem
    screenshot(app.dialogs.windows[-1], "start-refused-problems")


def test_start_runs_in_a_thread_and_the_footer_follows(app, trainable, fake_trainer, pump_until) -> None:
    trainer = fake_trainer(epochs=2, steps_per_epoch=3, hold=True)
    app.runner.train_function = trainer
    app.model.replace(trainable)
    assert app.start() is True
    footer = app.footer
    assert footer.start_button.cget("text") == "Stop training"
    assert footer.sample_button.cget("state") == "disabled"  # until the run's steps begin
    pump_until(app, lambda: footer.loss_label.cget("text").startswith("loss 0.5000"))
    assert footer.sample_button.cget("state") == "normal"
    assert footer.epoch_text.cget("text") == "1 / 2" and footer.step_text.cget("text") == "1 / 3"
    assert footer.speed_label.cget("text") == "4.00 it/s" and footer.eta_label.cget("text") == "ETA 0:01"
    assert 0 < footer.epoch_bar.get() < 1
    assert trainer.thread_name == "onetrainer-training"
    # The thread got a packed copy: editing the window's config does not reach it.
    assert trainer.config is not app.model.config and trainer.config.concepts[0].name == "shapes"
    view_of(app, "training", "learning_rate").set_text("0.9")
    assert trainer.config.learning_rate != 0.9

    footer.sample_button.invoke()
    footer.save_button.invoke()
    footer.backup_button.invoke()
    pump_until(app, lambda: len(trainer.commands) == 3)
    assert sorted(trainer.commands) == ["backup", "sample", "save"]

    trainer.release.set()
    pump_until(app, lambda: not footer.running)
    assert footer.status.startswith("Finished (completed)") and footer.status_level == "ok"
    assert footer.start_button.cget("text") == "Start training" and footer.start_button.cget("state") == "normal"
    assert footer.sample_button.cget("state") == "disabled"
    assert footer.epoch_bar.get() == 1 and footer.loss_label.cget("text").startswith("loss 0.0833")
    assert not app.dialogs.history  # nothing to report


def test_start_asks_the_hub_on_a_worker_thread_and_then_starts(
    app, trainable, fake_trainer, pump_until, monkeypatch
) -> None:
    import huggingface_hub

    from onetrainer.util import hub

    answer, answered = threading.Event(), threading.Event()

    def slow_hub(*args, **kwargs):  # a connection that answers only when the test lets it (or after 10 s)
        answer.wait(10)
        answered.set()

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)  # the suite runs offline
    monkeypatch.setattr(hub, "_probes", {})
    monkeypatch.setattr(hub, "is_cached", lambda *a, **k: True)
    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", slow_hub)
    trainer = fake_trainer(hold=True)
    app.runner.train_function = trainer
    trainable.base_model_name = "someone/hub-model"
    trainable.offline_mode = False
    app.model.replace(trainable)
    assert app.start() is False  # not refused: asking first
    assert not answered.is_set()  # the Tk thread did not wait for the hub
    assert "Checking the model on the Hugging Face hub (someone/hub-model)" in app.footer.status
    assert app.start() is False and not app.runner.is_alive()  # a second press while asking asks nothing more
    answer.set()
    pump_until(app, lambda: app.runner.is_alive())
    assert app.footer.start_button.cget("text") == "Stop training"
    trainer.release.set()
    pump_until(app, lambda: not app.footer.running)


def test_stop_requests_a_stop(app, trainable, fake_trainer, pump_until) -> None:
    trainer = fake_trainer(hold=True)
    app.runner.train_function = trainer
    app.model.replace(trainable)
    app.footer.start_button.invoke()
    pump_until(app, lambda: trainer.control is not None and app.footer.step_text.cget("text") == "1 / 3")
    app.footer.start_button.invoke()  # now "Stop training"
    assert trainer.control.stop_requested
    pump_until(app, lambda: not app.footer.running)
    assert app.footer.status.startswith("Finished (stopped)")
    assert app.footer.start_button.cget("text") == "Start training"


def test_caching_shows_its_progress_and_stop_ends_it(app, trainable, fake_trainer, pump_until) -> None:
    trainer = fake_trainer(hold=True, caching=4)
    app.runner.train_function = trainer
    app.model.replace(trainable)
    footer = app.footer
    footer.start_button.invoke()
    pump_until(app, lambda: footer.step_text.cget("text") == "1 / 4")
    # The step bar counts the images cached, with their rate and the time left (2 s per image so far).
    assert footer.step_label.cget("text") == "Caching" and footer.step_bar.get() == pytest.approx(0.25)
    assert (footer.speed_label.cget("text"), footer.eta_label.cget("text")) == ("2.00 s/img", "ETA 0:06")
    assert footer.status == "Caching latents: 1 of 4 images encoded, 0:06 left"
    # The trainer takes Sample / Save / Backup now at a step: none has begun, so they are disabled, and say so.
    for button in (footer.sample_button, footer.save_button, footer.backup_button):
        assert button.cget("state") == "disabled"
    app.save_now()
    assert "waits for the first step" in footer.status and not trainer.control.take("save")
    footer.start_button.invoke()  # "Stop training"
    assert trainer.control.stop_requested
    assert footer.status.startswith("Stopping after the image being cached")
    pump_until(app, lambda: not footer.running)
    assert footer.status.startswith("Finished (stopped during caching)")
    assert footer.start_button.cget("text") == "Start training" and not app.dialogs.history
    # The next run's training shows steps again.
    app.runner.train_function = fake_trainer(hold=True)
    footer.start_button.invoke()
    pump_until(app, lambda: footer.step_text.cget("text") == "1 / 3")
    assert footer.step_label.cget("text") == "Step" and footer.sample_button.cget("state") == "normal"
    app.stop()
    assert footer.sample_button.cget("state") == "disabled"  # a stopping run takes no more commands
    pump_until(app, lambda: not footer.running)


def test_a_run_refused_at_its_start_says_so_rather_than_that_training_failed(app, trainable, pump_until) -> None:
    from onetrainer.training.runner import run_training
    from onetrainer.training.workspace import WorkspaceLock

    app.runner.train_function = run_training
    app.model.replace(trainable)
    held = WorkspaceLock.acquire(trainable.workspace_dir)  # a second app (or a CLI run) trains there
    try:
        assert app.start()
        pump_until(app, lambda: not app.footer.running, timeout=120)
    finally:
        held.release()
    assert app.footer.status.startswith("Cannot start training: another run is training in the workspace")
    message = app.dialogs.history[-1]
    assert message.error and message.title == "Cannot start training" and "another run" in message.text


def test_a_failed_run_shows_the_message_and_the_log(app, trainable, fake_trainer, pump_until) -> None:
    app.runner.train_function = fake_trainer(epochs=1, steps_per_epoch=1, fail="CUDA out of memory")
    app.model.replace(trainable)
    assert app.start()
    pump_until(app, lambda: not app.footer.running)
    assert "Training failed: CUDA out of memory" in app.footer.status and app.footer.status_level == "error"
    message = app.dialogs.history[-1]
    assert message.error and "CUDA out of memory" in message.text and "/tmp/fake-run.log" in message.text


# -- autosave and closing ------------------------------------------------------------------------------------------


def test_autosave_restores_the_last_config(
    display, state_dir: Path, tmp_path: Path, pump_until, scripted_dialogs
) -> None:
    from gui.app import App

    config = TrainConfig()
    config.concept_file_name = str(tmp_path / "concepts.json")
    config.sample_definition_file_name = str(tmp_path / "samples.json")
    first = App(config, autosave=True, dialogs=scripted_dialogs)
    try:
        view = first.select_tab("training").form.view("learning_rate")
        view.set_text("0.0007")
        first.topbar.choose_method(TrainingMethod.LORA)
        saved = state_dir / "last-config.json"
        pump_until(first, lambda: saved.is_file() and json.loads(saved.read_text())["learning_rate"] == 0.0007)
        first.close()  # offers to save the changes in a file ("discard"), autosaves once more, then closes
        assert not _exists(first)
        assert any(q.startswith("save changes:") for q in first.dialogs.asked)
    finally:
        if _exists(first):
            first.destroy()
    second = App(None, autosave=False)
    try:
        assert second.model.config.learning_rate == 0.0007
        assert second.model.config.training_method is TrainingMethod.LORA
        assert second.select_tab("training").form.view("learning_rate").var.get() == "0.0007"
        assert "lora" in second.tabview.keys
    finally:
        second.destroy()


def test_closing_while_training_asks_about_the_run_first_and_stays_until_its_model_is_saved(
    display, state_dir, trainable, fake_trainer, pump_until, scripted_dialogs
) -> None:
    from gui.app import App

    saving = threading.Event()
    trainer = fake_trainer(hold=True, saving=saving)
    window = App(trainable, train_function=trainer, dialogs=scripted_dialogs, autosave=False)
    try:
        assert window.start()
        pump_until(window, lambda: window.footer.step_text.cget("text") == "1 / 3")
        window.model.set("learning_rate", 0.0007)  # an unsaved change
        asked = window.dialogs.asked
        window.dialogs.answers.append(False)
        window.close()  # "no" to stopping: nothing else is asked, the run goes on
        assert [q.split(":")[0] for q in asked] == ["yes/no"]
        destination = trainable.output_model_destination
        assert "Training is running (step 1 of 6)" in asked[0] and f"is saved to {destination}" in asked[0]
        assert window.winfo_exists() and window.runner.is_alive() and not trainer.control.stop_requested
        window.dialogs.answers += [True, None]
        window.close()  # the run first, then the settings: Cancel there keeps both
        assert [q.split(":")[0] for q in asked[1:]] == ["yes/no", "save changes"]
        assert window.runner.is_alive() and not trainer.control.stop_requested
        window.dialogs.answers += [True, "discard"]
        window.close()
        assert trainer.control.stop_requested
        # The run saves its model: the window stays, and says what it waits for, until the run has ended.
        closing = window.closing_window
        pump_until(window, lambda: closing.status == "saving the model")
        assert _exists(window) and window.runner.is_alive()
        assert closing.winfo_ismapped() and closing.quit_button.winfo_ismapped()
        window.close()  # a second close only brings the closing window forward
        assert _exists(window)
        saving.set()
        pump_until(window, lambda: not _exists(window), timeout=20)
        assert not window.runner.is_alive()
    finally:
        saving.set()
        if _exists(window):
            window.destroy()


def test_closing_before_the_first_step_says_nothing_is_saved(app, trainable, fake_trainer, pump_until) -> None:
    app.runner.train_function = fake_trainer(hold=True, caching=4)
    app.model.replace(trainable)
    assert app.start()
    pump_until(app, lambda: app.footer.step_text.cget("text") == "1 / 4")
    app.dialogs.answers.append(False)
    app.close()
    assert "Training is starting" in app.dialogs.asked[-1] and "no model is saved" in app.dialogs.asked[-1]
    assert app.runner.is_alive()


def _exists(window) -> bool:
    try:
        return bool(window.winfo_exists())
    except Exception:
        return False


# -- screenshots ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", [TrainingMethod.LORA, TrainingMethod.EMBEDDING], ids=lambda m: m.value.lower())
def test_screenshots_of_every_tab(app, screenshot, method: TrainingMethod) -> None:
    app.load_preset("sd15/lora")
    app.topbar.choose_model_type(ModelType.STABLE_DIFFUSION_XL_10_BASE)
    app.topbar.choose_method(method)
    app.model.config.output_model_format = ModelFormat.SAFETENSORS if method is TrainingMethod.EMBEDDING else (
        ModelFormat.KOHYA_LORA
    )  # fmt: skip
    app.model.config.concepts = [
        ConceptConfig(name="demo shapes", path="tiny:images"),
        ConceptConfig(name="my concept", path="/data/my-concept"),
    ]
    app.model.config.samples = []
    app.model.replace(app.model.config)
    app.select_tab("sampling").editor.add()
    app.select_tab("sampling").editor.view(0, "prompt").set_text("a photo of a cat wearing a hat")
    if method is TrainingMethod.LORA:
        app.select_tab("additional_embeddings").editor.add()
    view_of(app, "training", "learning_rate").set_text("1e-4x")  # one invalid input, to show its marking
    app.footer.reset_progress()  # what an earlier test's run left there is not part of the picture
    app.footer.set_status("Ready.")
    keys = app.tabview.keys if method is TrainingMethod.LORA else ["embedding"]
    for key in keys:
        app.select_tab(key)
        app.update()
        path = screenshot(app, f"tab-{key}" if method is TrainingMethod.LORA else f"tab-{key}-sdxl")
        assert path is None or path.stat().st_size > 10_000


# -- real pointer and keyboard events (xdotool) ----------------------------------------------------------------------


def _xdotool(*args: str) -> None:
    subprocess.run(["xdotool", *args], check=True, timeout=10)


def _center(widget) -> tuple[str, str]:
    widget.update_idletasks()
    return str(widget.winfo_rootx() + widget.winfo_width() // 2), str(widget.winfo_rooty() + widget.winfo_height() // 2)


@pytest.mark.skipif(shutil.which("xdotool") is None, reason="xdotool is not installed")
def test_real_clicks_and_typing(app, pump_until) -> None:
    config = app.model.config
    port = view_of(app, "general", "tensorboard_port")
    app.lift()
    app.update()
    _xdotool("mousemove", *_center(port.entry), "click", "1")
    pump_until(app, lambda: app.focus_get() is port.entry._entry)
    _xdotool("key", "End", "BackSpace", "BackSpace", "BackSpace", "BackSpace")
    _xdotool("type", "--delay", "20", "7007")
    pump_until(app, lambda: config.tensorboard_port == 7007)
    _xdotool("type", "--delay", "20", "x")  # invalid: marked, config keeps 7007
    pump_until(app, lambda: port.input_error is not None)
    assert config.tensorboard_port == 7007

    switch = view_of(app, "general", "only_cache").switch
    _xdotool("mousemove", *_center(switch), "click", "1")
    pump_until(app, lambda: config.only_cache is True)

    # Resting the pointer on a label shows its tooltip.
    label = view_of(app, "general", "prevent_overwrites").label
    _xdotool("mousemove", *_center(label))
    pump_until(app, lambda: any(t.window is not None for t in view_of(app, "general", "prevent_overwrites").tooltips))
    _xdotool("mousemove", "5", "995")
