"""The real trainer from the window: Start with the demo preset trains to the end; Stop ends a run cleanly.

Both run the library's `run_training` on the tiny SD 1.5 model in a temporary working directory (the demo preset's
relative paths land there).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from onetrainer.config import errors
from tests.gui.helpers import pump, view_of
from tests.helpers import PRESETS, TINY_MODELS

pytestmark = [pytest.mark.gui, pytest.mark.slow]
RUN_TIMEOUT = 600  # seconds; the demo takes well under a minute on two idle cores


@pytest.fixture
def demo_app(app, in_tmp: Path, trainable_sd):
    app.runner.train_function = None  # the real one
    assert app.load_preset("demo")
    switch = view_of(app, "general", "tensorboard").switch
    if switch.get():
        switch.toggle()  # no TensorBoard process in a test
    assert app.model.config.tensorboard is False
    return app


def test_start_with_the_demo_preset_trains_to_the_end(demo_app, in_tmp: Path, screenshot) -> None:
    app = demo_app
    # Validation on an image held out of the concept, set in the general tab as a user does.
    view_of(app, "general", "validation").switch.toggle()
    view_of(app, "general", "validation_holdout").set_text("1")
    assert (app.model.config.validation, app.model.config.validation_holdout) == (True, 1)
    app.footer.start_button.invoke()
    assert app.footer.start_button.cget("text") == "Stop training"
    pump(app, lambda: not app.footer.running, timeout=RUN_TIMEOUT)
    footer = app.footer
    assert footer.status.startswith("Finished (completed)"), footer.status
    assert footer.epoch_bar.get() == 1 and footer.step_bar.get() == 1
    assert footer.epoch_text.cget("text") == "6 / 6" and footer.loss_label.cget("text").startswith("loss ")
    # The latest validation loss and the best saved checkpoint stay shown; the Log has each validation's line.
    assert footer.validation_text.startswith("val ") and " · best: " in footer.validation_text, footer.validation_text
    assert "lowest so far" in footer.validation_tooltip.text and "t750-1000" in footer.validation_tooltip.text
    assert app.log.text.count("validation at epoch") == 6 and "best: " in app.log.text
    assert (in_tmp / "models" / "demo-lora.safetensors").stat().st_size > 0
    samples = app.gallery.images()
    assert samples and all(s.path.is_file() for s in samples)  # a sample appeared, and the viewer has it
    assert samples[0].path.is_relative_to(in_tmp / "workspace" / "demo" / "samples")
    app.select_tab("training")
    screenshot(app, "main-window-trained")
    tab = app.select_tab("sampling")
    assert len(tab.gallery.tiles) == len(samples)
    screenshot(app, "tab-sampling-after-training")

    # The config the run wrote (as the command line would) loads back into the window.
    (written,) = (in_tmp / "workspace" / "demo" / "config").glob("*.json")
    trained = app.model.config.to_dict()
    assert app.load_config_file(written)
    assert not errors(app.problems)
    loaded = app.model.config
    assert (loaded.learning_rate, loaded.lora_rank, loaded.epochs) == (trained["learning_rate"], 4, 6)
    assert [c.name for c in loaded.concepts] == ["demo shapes"]


@pytest.mark.parametrize("optimizer", ["PRODIGY_PLUS_SCHEDULE_FREE", "MUON", "ADAMW_ADV"])
def test_an_optimizer_chosen_in_the_window_trains_the_demo(demo_app, in_tmp: Path, optimizer) -> None:
    """OneTrainer's newer optimizers, chosen in the training tab's menu, train the demo LoRA (learning-rate-free ones
    at the learning rate their table row asks for)."""
    from onetrainer.config.optimizers import OPTIMIZERS
    from tests.gui.helpers import choose_in_menu

    app = demo_app
    choose_in_menu(view_of(app, "training", "optimizer.optimizer").menu, optimizer)
    rate = 1.0 if OPTIMIZERS[app.model.config.optimizer.optimizer].adaptive else 1e-3
    output = in_tmp / "out" / "lora.safetensors"
    settings = {"epochs": 1, "learning_rate": rate, "samples": [], "output_model_destination": str(output)}
    for path, value in settings.items():
        assert not errors(app.model.set(path, value)), path
    app.footer.start_button.invoke()
    pump(app, lambda: not app.footer.running, timeout=RUN_TIMEOUT)
    assert app.footer.status.startswith("Finished (completed)"), app.footer.status
    assert output.stat().st_size > 0


def test_stop_ends_a_real_run_cleanly(demo_app, in_tmp: Path) -> None:
    app = demo_app
    assert app.start()
    footer = app.footer
    stepping = lambda: footer.step_label.cget("text") == "Step" and footer.step_text.cget("text") not in ("–", "0 / 6")  # noqa: E731
    pump(app, lambda: stepping() or not footer.running, 300)  # past caching (the bar counts the images there)
    app.footer.start_button.invoke()  # "Stop training"
    assert app.footer.start_button.cget("text") == "Stopping…"
    pump(app, lambda: not app.footer.running, timeout=RUN_TIMEOUT)
    assert app.footer.status.startswith("Finished (stopped)"), app.footer.status
    assert app.footer.epoch_bar.get() < 1
    assert (in_tmp / "models" / "demo-lora.safetensors").is_file()  # a stopped run still saves its model
    assert not app.runner.is_alive() and not app.dialogs.history  # no failure reported


# The LoRA of each of these families trains from the window in the preset-per-family test below (pixart/lora,
# cascade/lora, wuerstchen/lora): the same Start, output and sample checks, so only the other methods are here.
@pytest.mark.parametrize(
    ("variant", "method", "size"),
    [
        ("cascade", "FINE_TUNE", 128),
        ("wuerstchen", "FINE_TUNE", 128),
        ("cascade", "EMBEDDING", 128),
        ("wuerstchen", "EMBEDDING", 128),
        ("hidream", "FINE_TUNE", 64),
        # the other families of the image families' issue: their fine-tunes from the window too
        ("sana", "FINE_TUNE", 64),
        ("ernie", "FINE_TUNE", 64),
        ("krea2", "FINE_TUNE", 64),
        ("anima", "FINE_TUNE", 64),
        ("lumina2", "FINE_TUNE", 64),
        ("ideogram4", "FINE_TUNE", 64),
    ],
)
def test_start_trains_each_method_of_the_newer_families_from_the_window(app, in_tmp: Path, variant, method, size):
    from onetrainer.config import config_from_dict
    from tests.helpers import OUTPUTS, image_folder, tiny_config

    app.runner.train_function = None  # the real one
    image_folder(in_tmp, placeholder="<shape>" if method == "EMBEDDING" else None)
    sample = {"prompt": "a red <shape>", "width": size, "height": size, "diffusion_steps": 2}
    settings = tiny_config(in_tmp, variant, method, epochs=1, samples=[sample], sample_after=1, resolution=str(size))
    if method == "FINE_TUNE":
        settings.update(output_model_format="DIFFUSERS", output_model_destination=str(in_tmp / "out" / "model"))
    config, problems = config_from_dict({**settings, "sample_after_unit": "EPOCH"})
    assert errors(problems) == []
    app.model.replace(config)
    app.footer.start_button.invoke()
    pump(app, lambda: not app.footer.running, timeout=RUN_TIMEOUT)
    assert app.footer.status.startswith("Finished (completed)"), app.footer.status
    output = Path(settings["output_model_destination"])
    index = ("model_index.json", "modular_model_index.json")  # a modular pipeline's folder (Anima) has the latter
    assert output.stat().st_size > 0 and (method != "FINE_TUNE" or any((output / n).is_file() for n in index))
    assert output.name == (OUTPUTS[method][1] if method != "FINE_TUNE" else "model")
    assert app.gallery.images()  # the sample (Cascade, Würstchen: prior → decoder → VQGAN) reached the window


def test_start_with_multi_gpu_trains_on_two_cpu_processes(app, in_tmp: Path) -> None:
    from onetrainer.config import config_from_dict
    from tests.helpers import image_folder, tiny_config

    app.runner.train_function = None  # the real one: this window's process is rank 0, rank 1 a child process
    image_folder(in_tmp, count=4)
    config, problems = config_from_dict(tiny_config(in_tmp, batch_size=1, epochs=1))
    assert errors(problems) == []
    app.model.replace(config)
    view_of(app, "general", "multi_gpu").switch.toggle()
    indexes = view_of(app, "general", "device_indexes")
    indexes.set_text("0")
    assert not app.start()  # one device: refused, naming the field
    assert "Device indexes" in app.footer.status or "device_indexes" in app.footer.status, app.footer.status
    indexes.set_text("0,1")
    assert (app.model.config.multi_gpu, app.model.config.device_indexes) == (True, "0,1")
    app.footer.start_button.invoke()
    pump(app, lambda: not app.footer.running, timeout=RUN_TIMEOUT)
    assert app.footer.status.startswith("Finished (completed)"), app.footer.status
    # 4 images at a global batch of 2 (1 per process): 2 steps, shown by the footer from rank 0's events.
    assert app.footer.step_text.cget("text") == "2 / 2" and app.footer.loss_label.cget("text")[5:6].isdigit()
    assert (in_tmp / "out" / "lora.safetensors").stat().st_size > 0
    logs = sorted(p.name for p in (in_tmp / "workspace" / "logs").iterdir())
    assert len(logs) == 2 and sum(name.endswith("-rank1.log") for name in logs) == 1, logs


def _one_preset_per_family() -> list[str]:
    from onetrainer.config import load_layers
    from onetrainer.config.model_types import model_type_info

    chosen: dict[str, str] = {}
    for name in sorted(PRESETS, key=lambda n: ("lora" not in n, n)):  # a LoRA preset where the family has one
        config, _ = load_layers(name, None, [])
        chosen.setdefault(model_type_info(config.model_type).family.key, name)
    return sorted(chosen.values())


@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_loaded_in_the_window_is_the_preset_as_shipped(app, preset):
    """What Start hands the trainer is the window's config: for every preset it is the preset's file as the CLI reads
    it (tests/cli/test_presets_as_shipped.py trains each of those); the test below trains one per family from here."""
    from onetrainer.config import load_layers

    assert app.load_preset(preset)
    shipped, _ = load_layers(preset, None, [])
    assert _without_uuids(app.model.config.to_dict()) == _without_uuids(shipped.to_dict())


def _without_uuids(value):
    """A config's values but the identities each load draws afresh (an embedding's uuid)."""
    if isinstance(value, dict):
        return {k: _without_uuids(v) for k, v in value.items() if k != "uuid"}
    if isinstance(value, list):
        return [_without_uuids(v) for v in value]
    return value


@pytest.mark.parametrize("preset", _one_preset_per_family())
def test_a_preset_of_each_family_loaded_in_the_window_trains_with_a_sample(app, in_tmp: Path, preset, monkeypatch):
    # As shipped (fp16/bf16 denoisers beside a float32 VAE, Cascade's fp16 effnet, 8-bit optimizers): only the base
    # model, the data, a sample and the size change, through the window's model (and NFLOAT_4 parts train in FLOAT_8
    # without CUDA, as in tests/cli/test_presets_as_shipped.py).
    from onetrainer.config.model_types import model_type_info
    from tests.helpers import edit_inputs, image_folder, nf4_stand_ins, small_edit_references

    app.runner.train_function = None  # the real one
    assert app.load_preset(preset)
    shipped = app.model.config
    step = model_type_info(shipped.model_type).family.bucket_step
    size = max(step, 64)
    embedding = shipped.training_method.value == "EMBEDDING"
    folder = image_folder(in_tmp, count=2, placeholder=shipped.embedding.placeholder if embedding else None)
    video = model_type_info(shipped.model_type).family.video is not None
    if video:  # a video family trains a clip beside the stills, in windows of 5 frames
        from tests.data.test_video_concepts import write_clip

        write_clip(folder / "walk.mp4", frames=9, size=(size, size))
        (folder / "walk.txt").write_text("a walking square", encoding="utf-8")
    sample_inputs = edit_inputs(folder, shipped.model_type.value)  # an edit model's references
    if sample_inputs:
        small_edit_references(monkeypatch)
    output = in_tmp / "out" / ("model" if shipped.output_model_format.is_directory else "model.safetensors")
    settings = {
        "base_model_name": f"tiny:{TINY_MODELS[shipped.model_type.value]}",
        "resolution": str(size),
        "epochs": 1,
        "tensorboard": False,
        "workspace_dir": str(in_tmp / "workspace"),
        "cache_dir": str(in_tmp / "cache"),
        "output_model_destination": str(output),
        "concepts": [{"name": "shapes", "path": str(folder)}],
        "samples": [{"prompt": "a red circle", "width": size, "height": size, "diffusion_steps": 2, **sample_inputs}],
        "sample_after_unit": "EPOCH",
        "sample_after": 1,
        **nf4_stand_ins(shipped),
        **({"frames": "5"} if video else {}),
    }
    for path, value in settings.items():
        assert not errors(app.model.set(path, value)), path
    app.footer.start_button.invoke()
    pump(app, lambda: not app.footer.running, timeout=RUN_TIMEOUT)
    assert app.footer.status.startswith("Finished (completed)"), app.footer.status
    # a LoRA of several denoisers may be a file each beside it (Wan 2.2's experts: `Family.lora_output_files`)
    outputs = [output] if output.exists() else sorted(output.parent.glob(f"{output.stem}_*{output.suffix}"))
    assert outputs and app.gallery.images() and not app.dialogs.history
    assert all(any(p.iterdir()) if p.is_dir() else p.stat().st_size > 0 for p in outputs)
    if video:  # the clip trained: a latent of several frames beside the stills' one-frame latents
        from safetensors.torch import load_file

        cached = [load_file(str(p)) for p in (in_tmp / "cache").rglob("*.safetensors")]
        frames = sorted({entry["latents"].shape[1] for entry in cached if "latents" in entry})
        assert frames[0] == 1 and frames[-1] > 1, frames


def test_a_flux_lora_preset_trains_from_the_window(app, in_tmp: Path) -> None:
    # One of our Flux presets as a user tries it offline: loaded from the menu's name, its base model switched to the
    # tiny Flux.1 dev in the Model tab's field, the demo images as its concept, then Start.
    app.runner.train_function = None  # the real one
    assert app.load_preset("flux/lora-24gb")
    assert (app.model.config.model_type.value, app.model.config.transformer.weight_dtype.value) == (
        "FLUX_DEV_1",
        "FLOAT_8",
    )  # as shipped: FLOAT_8 transformer and T5 (no CUDA needed)
    base = view_of(app, "model", "base_model_name")
    base.set_text("tiny:flux-dev")
    assert app.model.config.base_model_name == "tiny:flux-dev"
    settings = {
        "resolution": "64",
        "epochs": 1,
        "tensorboard": False,
        "workspace_dir": str(in_tmp / "workspace"),
        "cache_dir": str(in_tmp / "cache"),
        "concepts": [{"name": "demo shapes", "path": "tiny:images", "seed": 1}],
        "samples": [{"prompt": "a red circle", "width": 64, "height": 64, "diffusion_steps": 2}],
        "sample_after_unit": "EPOCH",
        "sample_after": 1,
    }
    for path, value in settings.items():
        assert not errors(app.model.set(path, value)), path
    app.footer.start_button.invoke()
    assert app.footer.start_button.cget("text") == "Stop training"
    pump(app, lambda: not app.footer.running, timeout=RUN_TIMEOUT)
    assert app.footer.status.startswith("Finished (completed)"), app.footer.status
    assert (in_tmp / "models" / "flux-lora.safetensors").stat().st_size > 0  # the preset's own destination
    samples = app.gallery.images()
    assert samples and samples[0].path.is_relative_to(in_tmp / "workspace" / "samples") and not app.dialogs.history
