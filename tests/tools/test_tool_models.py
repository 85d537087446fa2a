"""Masks and captions from tiny random-weight models (ClipSeg, u2net, BLIP, BLIP-2, Florence-2, WD14) on files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from onetrainer.tiny.tools import WD14_TAGS
from onetrainer.tools.captions import Captioner, CaptionTask, create_captioner
from onetrainer.tools.folder_pass import PassFailed, PassFinished, folder_images, run_pass
from onetrainer.tools.masks import MaskSettings, MaskTask, create_masker

RED, BLUE = (220, 20, 20), (20, 20, 220)


def image(path: Path, colour=RED, size=(40, 30)) -> Path:
    Image.new("RGB", size, colour).save(path)
    return path


def red_on_blue(path: Path) -> np.ndarray:
    pixels = np.zeros((32, 48, 3), dtype=np.uint8)
    pixels[:] = BLUE
    pixels[8:24, 12:36] = RED
    Image.fromarray(pixels).save(path)
    expected = np.zeros((32, 48), dtype=bool)
    expected[8:24, 12:36] = True
    return expected


# -- masks ----------------------------------------------------------------------------------------------------------


def test_clipseg_masks_a_folder_with_several_prompts(tmp_path, tiny_tool_model):
    image(tmp_path / "a.png")
    image(tmp_path / "b.jpg", size=(20, 50))
    masker = create_masker("CLIPSEG", ["a cat", "a red dog"], str(tiny_tool_model("clipseg")), device="cpu")
    masker.load()
    prediction = masker.predict(Image.open(tmp_path / "a.png").convert("RGB"))
    one = create_masker("CLIPSEG", ["a cat"], str(tiny_tool_model("clipseg")), device="cpu")
    one.load()
    single = one.predict(Image.open(tmp_path / "a.png").convert("RGB"))
    assert prediction.shape == single.shape == (32, 32) and 0 <= float(prediction.min()) <= 1
    # several prompts combine pixel by pixel to the highest probability
    assert bool((prediction >= single - 1e-6).all())

    result = run_pass(MaskTask(masker, MaskSettings(mode="replace", threshold=0.0)), folder_images(tmp_path))
    assert isinstance(result, PassFinished) and len(result.written) == 2
    assert Image.open(tmp_path / "b-masklabel.png").size == (20, 50)
    assert masker.model is None  # released after the pass


@pytest.mark.parametrize("model", ["REMBG", "REMBG_HUMAN"])
def test_u2net_marks_the_subject_with_a_local_onnx_file(tmp_path, tiny_tool_model, model):
    expected = red_on_blue(tmp_path / "a.png")
    masker = create_masker(model, [], str(tiny_tool_model("u2net")), device="cpu")
    task = MaskTask(masker, MaskSettings(mode="replace", threshold=0.5, smooth_pixels=0, expand_pixels=0))
    result = run_pass(task, folder_images(tmp_path))
    assert isinstance(result, PassFinished), result
    mask = np.asarray(Image.open(tmp_path / "a-masklabel.png"))
    # the tiny model works at 32 px and is scaled back up: the edges blur, the inside and the outside are exact
    inside, outside = expected.copy(), ~expected
    inside[:10] = inside[22:] = False
    outside[4:28, 6:42] = False
    assert (mask[inside] == 255).all() and (mask[outside] == 0).all()


def test_u2net_model_path_must_be_a_file(tmp_path):
    with pytest.raises(ValueError, match="onnx"):
        create_masker("REMBG", [], str(tmp_path), device="cpu")


def test_a_damaged_onnx_file_fails_the_pass_with_its_name(tmp_path):
    image(tmp_path / "a.png")
    bad = tmp_path / "models" / "u2net.onnx"
    bad.parent.mkdir()
    bad.write_bytes(b"not onnx")
    result = run_pass(
        MaskTask(create_masker("REMBG", [], str(bad), device="cpu"), MaskSettings()), [tmp_path / "a.png"]
    )
    assert isinstance(result, PassFailed) and str(bad) in result.message


# -- captions -------------------------------------------------------------------------------------------------------


def test_wd14_tags_general_only_most_likely_first_with_spaces(tmp_path, tiny_tool_model):
    captioner = create_captioner("WD14_VIT_2", str(tiny_tool_model("wd14")), device="cpu")
    captioner.load()
    assert captioner.caption(Image.new("RGB", (50, 40), (0, 0, 255))) == "blue sky, simple background, outdoors"
    # RGB red must reach the model as BGR: only "red dress" sees the last channel
    assert captioner.caption(Image.new("RGB", (50, 40), (255, 0, 0))) == "red dress, simple background, outdoors"
    assert {name for name, _ in WD14_TAGS} >= {"general", "hatsune_miku"}  # rating and character tags exist


def test_wd14_model_path_can_name_the_onnx_file(tmp_path, tiny_tool_model):
    captioner = create_captioner("WD14_VIT_2", str(tiny_tool_model("wd14") / "model.onnx"), device="cpu")
    captioner.load()
    assert captioner.caption(Image.new("RGB", (8, 8), (0, 0, 0))) == "simple background, outdoors"


@pytest.mark.parametrize("name", ["BLIP", "BLIP2"])
def test_blip_captions_continue_the_initial_caption(tmp_path, tiny_tool_model, name):
    captioner = create_captioner(name, str(tiny_tool_model(name.lower())), device="cpu")
    captioner.load()
    plain = captioner.caption(Image.new("RGB", (40, 30), RED))
    assert isinstance(plain, str)
    started = captioner.caption(Image.new("RGB", (40, 30), RED), "A photo of")
    assert started.startswith("A photo of") and len(started) > len("A photo of")
    image(tmp_path / "a.png")
    task = CaptionTask(captioner, mode="replace", initial_caption="A photo of", prefix="pre, ", postfix=", post")
    run_pass(task, folder_images(tmp_path))
    text = (tmp_path / "a.txt").read_text(encoding="utf-8")
    assert text.startswith("pre, A photo of") and text.endswith(", post") and "\n" not in text


def test_florence2_captions_and_refuses_an_initial_caption(tmp_path, tiny_tool_model):
    captioner = create_captioner("FLORENCE_2", str(tiny_tool_model("florence2")), device="cpu")
    image(tmp_path / "a.png")
    result = run_pass(CaptionTask(captioner, mode="replace", prefix="photo"), folder_images(tmp_path))
    assert isinstance(result, PassFinished) and (tmp_path / "a.txt").read_text(encoding="utf-8").startswith("photo")
    with pytest.raises(ValueError, match="initial caption"):
        CaptionTask(captioner, initial_caption="a photo of")


def test_unknown_caption_model_is_named():
    with pytest.raises(ValueError, match="LLAVA"):
        create_captioner("LLAVA", device="cpu")


class _Fixed(Captioner):
    name = "FIXED"

    def __init__(self) -> None:
        self.count = 0

    def caption(self, image, initial=""):
        self.count += 1
        return f"{initial} caption {self.count}".strip()


def test_caption_modes_on_files(tmp_path):
    image(tmp_path / "a.png")
    image(tmp_path / "b.png")
    image(tmp_path / "c.png")
    (tmp_path / "a.txt").write_text("mine", encoding="utf-8")
    (tmp_path / "b.txt").write_text("  \n", encoding="utf-8")  # empty: counts as missing
    images = folder_images(tmp_path)

    result = run_pass(CaptionTask(_Fixed(), mode="fill"), images)
    assert (tmp_path / "a.txt").read_text(encoding="utf-8") == "mine"
    assert (tmp_path / "b.txt").read_text(encoding="utf-8") == "caption 1"
    assert (tmp_path / "c.txt").read_text(encoding="utf-8") == "caption 2"
    assert result.kept == [str(tmp_path / "a.png")]

    run_pass(CaptionTask(_Fixed(), mode="add", prefix="x, "), images)
    assert (tmp_path / "a.txt").read_text(encoding="utf-8") == "mine\nx, caption 1"

    run_pass(CaptionTask(_Fixed(), mode="replace", postfix="!"), images)
    assert [(tmp_path / f"{n}.txt").read_text(encoding="utf-8") for n in "abc"] == [
        "caption 1!",
        "caption 2!",
        "caption 3!",
    ]
    with pytest.raises(ValueError, match="mode"):
        CaptionTask(_Fixed(), mode="append")


def test_unreadable_image_is_skipped_and_its_caption_untouched(tmp_path):
    image(tmp_path / "a.png")
    (tmp_path / "b.png").write_bytes(b"\x89PNG broken")
    (tmp_path / "b.txt").write_text("kept", encoding="utf-8")
    result = run_pass(CaptionTask(_Fixed(), mode="replace"), folder_images(tmp_path))
    assert [p for p, _ in result.skipped] == [str(tmp_path / "b.png")]
    assert (tmp_path / "b.txt").read_text(encoding="utf-8") == "kept"
    assert (tmp_path / "a.txt").read_text(encoding="utf-8") == "caption 1"


def test_captions_on_cuda_release_the_cache(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append(1))
    image(tmp_path / "a.png")
    run_pass(CaptionTask(_Fixed(), mode="replace"), folder_images(tmp_path))
    assert calls == [1]


def test_u2net_download_is_checked_cached_and_atomic(tmp_path, monkeypatch, tiny_tool_model):
    import hashlib

    from onetrainer.tools import masks
    from onetrainer.tools.folder_pass import ModelLoadError

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    source = tiny_tool_model("u2net")
    md5 = hashlib.md5(source.read_bytes()).hexdigest()
    good = masks.U2NetFile("u2net.onnx", source.as_uri(), md5)
    path = masks.download_u2net(good)
    assert path.read_bytes() == source.read_bytes() and path.is_relative_to(tmp_path / "cache")
    path.write_bytes(b"cached")  # a second call reuses the file instead of downloading again
    assert masks.download_u2net(good).read_bytes() == b"cached"

    damaged = masks.U2NetFile("u2net_human_seg.onnx", source.as_uri(), "0" * 32)
    with pytest.raises(ModelLoadError, match="MD5"):
        masks.download_u2net(damaged)
    assert [p.name for p in path.parent.iterdir()] == ["u2net.onnx"]  # no half-written file left
    missing = masks.U2NetFile("other.onnx", (tmp_path / "nothing.onnx").as_uri(), md5)
    with pytest.raises(ModelLoadError, match="--model-path"):
        masks.download_u2net(missing)
