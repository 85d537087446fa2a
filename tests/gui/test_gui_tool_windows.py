"""The tools tab's mask, caption and conversion windows: filled in, started, followed to the end, cancelled."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from onetrainer.tools.folder_pass import PassFinished
from onetrainer.tools.masks import Masker, MaskSettings, MaskTask
from tests.gui.helpers import choose_in_menu, pump

pytestmark = pytest.mark.gui


def set_entry(entry, text: str) -> None:
    entry.delete(0, "end")
    entry.insert(0, text)


def backdrop_folder(tmp_path: Path, count: int = 3, size: tuple[int, int] = (32, 24)) -> Path:
    folder = tmp_path / "images"
    folder.mkdir()
    for i in range(count):
        pixels = np.zeros((size[1], size[0], 3), dtype=np.uint8)
        pixels[:] = (0, 255, 0)
        pixels[6:18, 8 + i : 20 + i] = (200, 30, 30)
        Image.fromarray(pixels).save(folder / f"{i}.png")
    return folder


def test_mask_window_masks_a_folder_by_colour(app, tmp_path, screenshot):
    folder = backdrop_folder(tmp_path)
    Image.new("L", (32, 24), 99).save(folder / "0-masklabel.png")
    window = app.select_tab("tools").open_tool("masks")
    assert app.select_tab("tools").open_tool("masks") is window  # one window, shown again
    set_entry(window.folder, str(folder))
    choose_in_menu(window.model, "COLOR")
    set_entry(window.prompts, "#00ff00")
    set_entry(window.smooth, "0")
    set_entry(window.expand, "0")
    assert window.start()
    pump(window, lambda: window.outcome is not None and window.start_button.cget("state") == "normal")
    assert isinstance(window.outcome, PassFinished) and len(window.outcome.written) == 2
    assert window.progress.get() == pytest.approx(1.0)
    assert "done: 2 written, 1 kept" in window.status.cget("text")
    assert set(np.unique(np.asarray(Image.open(folder / "0-masklabel.png")))) == {99}  # fill keeps it
    mask = np.asarray(Image.open(folder / "1-masklabel.png"))
    assert mask[12, 15] == 255 and mask[0, 0] == 0
    screenshot(window, "tools-generate-masks")

    set_entry(window.prompts, "green")
    assert not window.start()
    assert "not a hex colour" in window.status.cget("text")
    window.close()


class _Slow(Masker):
    name = "SLOW"

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.calls = 0

    def predict(self, image):
        import torch

        self.calls += 1
        self.gate.wait(60)  # released by the test (a guard, not a speed)
        return torch.ones(image.height, image.width)


def test_mask_window_cancel_stops_between_images(app, tmp_path):
    folder = backdrop_folder(tmp_path, count=4)
    window = app.select_tab("tools").open_tool("masks")
    set_entry(window.folder, str(folder))
    slow = _Slow()
    window.make_task = lambda: lambda: MaskTask(slow, MaskSettings(mode="replace"))
    assert window.start()
    pump(window, lambda: slow.calls == 1)
    window.cancel_button.invoke()
    slow.gate.set()
    pump(window, lambda: window.outcome is not None and window.start_button.cget("state") == "normal")
    assert window.outcome.cancelled and len(window.outcome.written) == 1
    assert "cancelled" in window.status.cget("text")
    window.close()


def test_mask_window_shows_the_model_download_and_cancels_it(app, tmp_path, monkeypatch, screenshot):
    from onetrainer.tiny.tools import write_tiny_clipseg
    from tests.tools.test_downloads import REPO, FakeHub

    gate = threading.Semaphore(0)
    hub = FakeHub(write_tiny_clipseg(tmp_path / "clipseg"), gate=gate)
    hub.install(monkeypatch)
    folder = backdrop_folder(tmp_path, count=2)
    window = app.select_tab("tools").open_tool("masks")
    set_entry(window.folder, str(folder))
    choose_in_menu(window.model, "CLIPSEG")
    set_entry(window.prompts, "a cat")
    set_entry(window.model_path, REPO)
    assert window.start()
    gate.release(3)  # three of ten MB arrive
    pump(window, lambda: "downloading model.safetensors: 3 / 10 MB" in window.status.cget("text"))
    assert window.progress.get() == pytest.approx(0.3, abs=0.01)
    screenshot(window, "tools-model-download")
    window.cancel_button.invoke()
    gate.release(7)
    pump(window, lambda: window.outcome is not None and window.start_button.cget("state") == "normal")
    assert window.outcome.cancelled and window.outcome.written == [] and not hub.downloaded
    assert "cancelled" in window.status.cget("text")
    window.close()


def test_caption_window_tags_a_folder_with_a_local_wd14_model(app, tmp_path, screenshot):
    from onetrainer.tiny.tools import write_tiny_wd14

    folder = tmp_path / "images"
    folder.mkdir()
    Image.new("RGB", (20, 20), (0, 0, 255)).save(folder / "a.png")
    (folder / "b.png").write_bytes(b"broken")
    model = write_tiny_wd14(tmp_path / "wd14")
    window = app.select_tab("tools").open_tool("captions")
    set_entry(window.folder, str(folder))
    choose_in_menu(window.model, "WD14_VIT_2")
    set_entry(window.model_path, str(model))
    set_entry(window.device, "cpu")
    set_entry(window.prefix, "photo, ")
    assert window.start()
    pump(window, lambda: window.outcome is not None and window.start_button.cget("state") == "normal")
    assert (folder / "a.txt").read_text(encoding="utf-8") == "photo, blue sky, simple background, outdoors"
    assert "b.png" in window.log.get("1.0", "end")  # the unreadable image is named
    screenshot(window, "tools-generate-captions")
    set_entry(window.initial, "a photo of")
    assert not window.start() and "initial caption" in window.status.cget("text")
    window.close()


def test_convert_window_writes_a_single_file(app, tmp_path):
    from onetrainer.tiny import tiny_model_dir

    window = app.select_tab("tools").open_tool("convert")
    assert window.output_format.cget("values") == ["ORIGINAL_SINGLE_FILE", "DIFFUSERS", "LEGACY_SAFETENSORS"]
    choose_in_menu(window.method, "LORA")
    assert "KOHYA_LORA" in window.output_format.cget("values") and window.output_format.get() == "KOHYA_LORA"
    choose_in_menu(window.method, "FINE_TUNE")
    choose_in_menu(window.output_format, "ORIGINAL_SINGLE_FILE")
    set_entry(window.input_name, str(tiny_model_dir("sd15")))
    destination = tmp_path / "model.safetensors"
    set_entry(window.destination, str(destination))
    assert window.convert()
    pump(window, lambda: window.convert_button.cget("state") == "normal", timeout=60)
    assert window.written == [destination] and destination.is_file()
    assert not window.convert() and "exists" in window.status.cget("text")
    assert "'Replace an existing destination'" in window.status.cget("text") and "--" not in window.status.cget("text")
    window.destroy()


def test_convert_window_clears_its_result_when_an_input_changes_and_browses(app, tmp_path):
    from onetrainer.tiny import tiny_model_dir

    window = app.select_tab("tools").open_tool("convert")
    try:
        set_entry(window.input_name, str(tiny_model_dir("sd15")))
        destination = tmp_path / "model.safetensors"
        set_entry(window.destination, str(destination))
        assert window.convert()
        pump(window, lambda: window.convert_button.cget("state") == "normal", timeout=60)
        assert window.status.cget("text").startswith("written: ")

        # Any input changed: the "written: …" of the last inputs goes.
        set_entry(window.destination, str(tmp_path / "other.safetensors"))
        assert window.status.cget("text") == "" and window.written == []
        window._show("written: something")
        choose_in_menu(window.output_dtype, "FLOAT_32")
        assert window.status.cget("text") == ""
        window._show("written: something")
        window.overwrite.toggle()
        assert window.status.cget("text") == ""

        # Browse buttons beside the paths: a file or a folder for the input, where to save for the destination.
        dialogs = app.dialogs
        dialogs.answers.extend([str(tmp_path / "picked"), str(tmp_path / "model.ckpt"), str(tmp_path / "out.st")])
        window.paths["input"].buttons["folder"].invoke()
        assert window.input_name.get() == str(tmp_path / "picked")
        window.paths["base_model"].buttons["file"].invoke()
        assert window.base_model.get() == str(tmp_path / "model.ckpt")
        window.paths["destination"].buttons["save"].invoke()
        assert window.destination.get() == str(tmp_path / "out.st")
        choose_in_menu(window.output_format, "DIFFUSERS")
        dialogs.answers.append(str(tmp_path / "diffusers-out"))
        window.paths["destination"].buttons["save"].invoke()  # a diffusers model is a folder: a folder is asked for
        assert window.destination.get() == str(tmp_path / "diffusers-out")
        kinds = [q.split(":")[0] for q in dialogs.asked[-4:]]
        assert kinds == ["open dir", "open file", "save file", "open dir"]
    finally:
        window.destroy()


def test_convert_window_converts_an_a1111_embedding(app, tmp_path):
    import torch
    from safetensors.torch import load_file

    from onetrainer.tiny import tiny_model_dir

    legacy = tmp_path / "style.pt"
    vectors = torch.randn(2, 32, generator=torch.Generator().manual_seed(0))
    torch.save({"string_to_param": {"*": vectors}, "name": "style"}, legacy)
    window = app.select_tab("tools").open_tool("convert")
    choose_in_menu(window.method, "EMBEDDING")
    assert window.output_format.cget("values") == ["SAFETENSORS"]
    set_entry(window.input_name, str(legacy))
    set_entry(window.base_model, str(tiny_model_dir("sd15")))
    destination = tmp_path / "style.safetensors"
    set_entry(window.destination, str(destination))
    assert window.convert()
    pump(window, lambda: window.convert_button.cget("state") == "normal", timeout=60)
    assert window.written == [destination]
    assert torch.equal(load_file(str(destination))["emb_params"], vectors.half())
    window.destroy()


def test_sampling_window_renders_with_a_lora_and_keeps_its_settings(app, tmp_path, screenshot):
    from onetrainer.tiny import tiny_model_dir
    from tests.cli.test_sample_cli import write_lora

    base = str(tiny_model_dir("sd15"))
    lora = tmp_path / "lora.safetensors"
    write_lora(base, lora)
    window = app.select_tab("tools").open_tool("sampling")
    assert "SD 1.5" in window.model_type.cget("values")  # the labels the main window shows, not STABLE_DIFFUSION_15
    assert not any(v.startswith("STABLE_DIFFUSION") for v in window.model_type.cget("values"))
    choose_in_menu(window.model_type, "SD 1.5")
    values = {"base_model": base, "lora": str(lora), "prompt": "a red circle", "width": "64", "height": "64",
              "steps": "2", "count": "2", "device": "cpu", "output": str(tmp_path / "out")}  # fmt: skip
    for key, value in values.items():
        set_entry(window.entries[key], value)
    set_entry(window.entries["steps"], "two")
    assert not window.render() and "Steps" in window.status.cget("text")
    set_entry(window.entries["steps"], "2")
    assert window.render()
    pump(window, lambda: window.render_button.cget("state") == "normal", timeout=60)
    assert len(window.images) == 2 and all(p.is_file() for p in window.images), window.status.cget("text")
    assert window.status.cget("text") == f"2 images: {tmp_path / 'out'}"
    assert len(window.gallery.winfo_children()) == 2
    screenshot(window, "tools-sampling")

    set_entry(window.entries["count"], "1")
    assert window.render()
    pump(window, lambda: window.render_button.cget("state") == "normal", timeout=60)
    assert window.status.cget("text") == f"1 image: {tmp_path / 'out'}"
    window.destroy()

    # Reopened: the render settings are the last use's; the model and the output folder are the config's.
    reopened = app.select_tab("tools").open_tool("sampling")
    assert reopened is not window
    remembered = ("lora", "prompt", "width", "height", "steps", "count", "device")
    assert {k: reopened.entries[k].get() for k in remembered} == {k: values[k] for k in remembered} | {"count": "1"}
    config = app.model.config
    assert reopened.entries["base_model"].get() == config.base_model_name
    assert reopened.entries["output"].get() == str(Path(config.workspace_dir) / "samples" / "sampling-tool")
    assert reopened.model_type.get() == "SD 1.5"
    reopened.destroy()


def test_sampling_window_starts_from_the_current_config(app, trainable, tmp_path):
    from gui.labels import model_type_label
    from onetrainer.config import ModelType, SampleConfig, TrainingMethod
    from onetrainer.config.enums import NoiseScheduler

    trainable.model_type = ModelType.STABLE_DIFFUSION_XL_10_BASE
    trainable.base_model_name = "tiny:sdxl"
    trainable.training_method = TrainingMethod.LORA
    Path(trainable.output_model_destination).parent.mkdir(parents=True)
    Path(trainable.output_model_destination).write_bytes(b"")  # the LoRA a run wrote
    trainable.samples = [
        SampleConfig(prompt="off", enabled=False),
        SampleConfig(prompt="a blue square", width=96, height=128, diffusion_steps=7, cfg_scale=5.5, seed=9,
                     noise_scheduler=NoiseScheduler.EULER_A),
    ]  # fmt: skip
    app.model.replace(trainable)
    window = app.select_tab("tools").open_tool("sampling")
    try:
        assert window.model_type.get() == model_type_label(ModelType.STABLE_DIFFUSION_XL_10_BASE)
        got = {k: window.entries[k].get() for k in ("base_model", "lora", "prompt", "width", "height", "steps")}
        assert got == {"base_model": "tiny:sdxl", "lora": trainable.output_model_destination,
                       "prompt": "a blue square", "width": "96", "height": "128", "steps": "7"}  # fmt: skip
        assert (window.entries["cfg_scale"].get(), window.entries["seed"].get()) == ("5.5", "9")
        assert window.sampler.get() == "EULER_A"
        # The images go under the config's workspace, not into the folder the app was started from.
        assert window.entries["output"].get() == str(Path(trainable.workspace_dir) / "samples" / "sampling-tool")
        arguments = window.arguments()
        assert arguments[arguments.index("--model-type") + 1] == "STABLE_DIFFUSION_XL_10_BASE"
        # Messages name the window's fields, not scripts/sample.py's options.
        set_entry(window.entries["output"], "")
        assert not window.render() and "Output folder" in window.status.cget("text")
        set_entry(window.entries["output"], str(tmp_path / "out"))
        set_entry(window.entries["count"], "0")
        assert window.render()
        pump(window, lambda: window.render_button.cget("state") == "normal", timeout=60)
        assert window.status.cget("text") == "Images must be at least 1, not 0"
    finally:
        window.destroy()


def test_dataset_tool_masks_and_captions_the_shown_image_and_the_folder_with_undo(app, tmp_path, screenshot):
    from onetrainer.data.images import mask_path_of
    from onetrainer.tiny.tools import write_tiny_wd14

    folder = backdrop_folder(tmp_path, size=(64, 48))  # room around the subject for the default 10 px expansion
    images = sorted(folder.glob("*.png"))
    painted = np.zeros((48, 64), dtype=np.uint8)
    painted[:4] = 255
    Image.fromarray(painted).save(mask_path_of(images[0]))
    (folder / "0.txt").write_text("my caption", encoding="utf-8")
    tool = app.select_tab("tools").open_dataset_tool(str(folder))
    auto = tool.automation
    assert tool.position == 0 and tool.document.has_mask

    def wait() -> None:
        pump(tool, lambda: not auto.runner.is_alive() and auto.mask_image_button.cget("state") == "normal")

    # the shown image, by colour: replaced and shown at once; undo brings the painted mask back
    choose_in_menu(auto.mask_model, "COLOR")
    auto.mask_prompt.insert(0, "#00ff00")
    assert auto.mask(folder=False)
    wait()
    new = np.asarray(tool.document.mask)
    assert new[12, 12] == 255 and new[40, 60] == 0 and new[2, 60] == 0  # the subject, not the painted strip
    assert np.array_equal(np.asarray(Image.open(mask_path_of(images[0]))), new)
    assert "Undo auto" in tool.status.cget("text")
    screenshot(tool, "dataset-tool-auto-mask")
    assert auto.undo()
    assert np.array_equal(np.asarray(Image.open(mask_path_of(images[0]))), painted)
    assert np.array_equal(np.asarray(tool.document.mask), painted)

    # the folder: fill mode, the painted mask is kept; undo removes what the pass wrote
    assert auto.mask(folder=True)
    wait()
    assert np.array_equal(np.asarray(Image.open(mask_path_of(images[0]))), painted)
    assert mask_path_of(images[1]).exists() and mask_path_of(images[2]).exists()
    assert auto.undo()
    assert not mask_path_of(images[1]).exists() and mask_path_of(images[0]).exists()

    # captions: the shown image's caption is replaced and shown; undo restores the user's text
    choose_in_menu(auto.caption_model, "WD14_VIT_2")
    auto.caption_path.insert(0, str(write_tiny_wd14(tmp_path / "wd14")))
    assert auto.caption(folder=False)
    wait()
    assert tool.caption_text() == "simple background, outdoors" == (folder / "0.txt").read_text(encoding="utf-8")
    assert auto.undo()
    assert (folder / "0.txt").read_text(encoding="utf-8") == "my caption" == tool.caption_text()
    assert auto.caption(folder=True)
    wait()
    assert (folder / "0.txt").read_text(encoding="utf-8") == "my caption"
    assert (folder / "1.txt").read_text(encoding="utf-8") == "simple background, outdoors"
    tool.close()


def test_the_mask_windows_u2net_errors_name_its_model_path_field(app, tmp_path, monkeypatch):
    import urllib.request

    folder = backdrop_folder(tmp_path, count=1)
    window = app.select_tab("tools").open_tool("masks")
    try:
        set_entry(window.folder, str(folder))
        choose_in_menu(window.model, "REMBG")
        set_entry(window.model_path, str(tmp_path / "no-such-u2net.onnx"))
        set_entry(window.device, "cpu")
        if window.start():
            pump(window, lambda: window.outcome is not None and window.start_button.cget("state") == "normal")
        text = window.status.cget("text")
        assert text.startswith("Model path for REMBG must be a .onnx file") and "--" not in text, text

        # Offline, the download fails: the message says which field and button take a downloaded file.
        def unreachable(*_args, **_kwargs):
            raise OSError("network is unreachable")

        monkeypatch.setattr(urllib.request, "urlopen", unreachable)
        set_entry(window.model_path, "")
        assert window.start()
        pump(window, lambda: window.outcome is not None and window.start_button.cget("state") == "normal")
        text = window.status.cget("text")
        assert "choose the file with the File… button of the Model path field" in text and "--" not in text, text

        app.dialogs.answers.append(str(tmp_path / "u2net.onnx"))
        window.model_path.master.buttons["file"].invoke()  # that button, beside the field
        assert window.model_path.get() == str(tmp_path / "u2net.onnx")
    finally:
        window.close()
