"""scripts/generate_masks.py and scripts/generate_captions.py: OneTrainer's arguments, exit codes, README usage."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from onetrainer.cli import generate_captions, generate_masks
from onetrainer.cli.tool_pass import EXIT_FAILED, EXIT_INVALID, EXIT_OK
from onetrainer.tiny.tools import write_tiny_u2net, write_tiny_wd14
from tests.conftest import ROOT


def backdrop_folder(tmp_path, subfolder: bool = False):
    folder = tmp_path / "images"
    (folder / "sub").mkdir(parents=True)
    pixels = np.zeros((12, 16, 3), dtype=np.uint8)
    pixels[:] = (0, 255, 0)
    pixels[3:8, 4:10] = (200, 30, 30)
    Image.fromarray(pixels).save(folder / "a.png")
    Image.fromarray(pixels).save(folder / "sub" / "b.png")
    return folder


def test_colour_masks_with_onetrainer_arguments(tmp_path, capsys):
    folder = backdrop_folder(tmp_path)
    args = ["--model", "COLOR", "--sample-dir", str(folder), "--add-prompt", "#00ff00", "--mode", "replace",
            "--threshold", "0.3", "--smooth-pixels", "0", "--expand-pixels", "1", "--alpha", "1", "--device", "cpu",
            "--dtype", "FLOAT_32"]  # fmt: skip
    assert generate_masks.main(args) == EXIT_OK
    mask = np.asarray(Image.open(folder / "a-masklabel.png"))
    expected = np.zeros((12, 16), dtype=bool)
    expected[2:9, 3:11] = True
    assert np.array_equal(mask == 255, expected)
    assert not (folder / "sub" / "b-masklabel.png").exists()
    assert str(folder / "a-masklabel.png") in capsys.readouterr().out

    assert generate_masks.main([*args, "--include-subdirectories"]) == EXIT_OK
    assert (folder / "sub" / "b-masklabel.png").exists()


def test_fill_is_the_default_and_keeps_existing_masks(tmp_path):
    folder = backdrop_folder(tmp_path)
    Image.new("L", (16, 12), 77).save(folder / "a-masklabel.png")
    assert generate_masks.main(["--model", "color", "--sample-dir", str(folder), "--add-prompt", "00ff00"]) == 0
    assert set(np.unique(np.asarray(Image.open(folder / "a-masklabel.png")))) == {77}


def test_u2net_with_a_local_model_file(tmp_path):
    folder = backdrop_folder(tmp_path)
    model = write_tiny_u2net(tmp_path / "u2net.onnx")
    args = ["--model", "REMBG", "--sample-dir", str(folder), "--add-prompt", "x", "--model-path", str(model)]
    assert generate_masks.main(args) == EXIT_OK
    assert (folder / "a-masklabel.png").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "COLOR", "--sample-dir", "{folder}"], "needs --add-prompt"),
        (["--model", "COLOR", "--sample-dir", "{folder}", "--add-prompt", "green"], "not a hex colour"),
        (["--model", "CLIPSEG", "--sample-dir", "{missing}", "--add-prompt", "a cat"], "does not exist"),
        (["--model", "REMBG", "--sample-dir", "{folder}", "--add-prompt", "x", "--model-path", "{folder}"], ".onnx"),
        (["--model", "COLOR", "--sample-dir", "{folder}", "--add-prompt", "#000000", "--expand-pixels", "-1"],
         "negative"),
        (["--model", "SAM", "--sample-dir", "{folder}", "--add-prompt", "x"], "invalid choice"),
        (["--model", "COLOR", "--sample-dir", "{folder}", "--add-prompt", "#000000", "--mode", "invert"],
         "invalid choice"),
    ],
)  # fmt: skip
def test_mask_arguments_that_cannot_work_exit_2(tmp_path, capsys, args, message):
    folder = backdrop_folder(tmp_path)
    args = [a.format(folder=folder, missing=tmp_path / "missing") for a in args]
    with pytest.raises(SystemExit) if "invalid choice" in message else _no_raise() as exited:
        code = generate_masks.main(args)
    code = exited.value.code if exited is not None else code
    assert code == EXIT_INVALID
    assert message in capsys.readouterr().err


class _no_raise:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def test_wd14_captions_with_onetrainer_arguments(tmp_path):
    folder = tmp_path / "images"
    folder.mkdir()
    Image.new("RGB", (20, 20), (0, 0, 255)).save(folder / "a.png")
    (folder / "b.png").write_bytes(b"broken")
    model = write_tiny_wd14(tmp_path / "wd14")
    args = ["--model", "WD14_VIT_2", "--sample-dir", str(folder), "--model-path", str(model), "--device", "cpu",
            "--caption-prefix", "photo, ", "--caption-postfix", ", blue", "--mode", "replace"]  # fmt: skip
    assert generate_captions.main(args) == EXIT_OK
    assert (folder / "a.txt").read_text(encoding="utf-8") == "photo, blue sky, simple background, outdoors, blue"
    assert not (folder / "b.txt").exists()  # named and skipped
    assert generate_captions.main([*args[:-2], "--mode", "add"]) == EXIT_OK
    assert (folder / "a.txt").read_text(encoding="utf-8").count("\n") == 1


def test_caption_arguments_that_cannot_work(tmp_path, capsys):
    folder = tmp_path / "images"
    folder.mkdir()
    Image.new("RGB", (20, 20)).save(folder / "a.png")
    model = write_tiny_wd14(tmp_path / "wd14")
    common = ["--sample-dir", str(folder), "--device", "cpu"]
    assert generate_captions.main(["--model", "WD14_VIT_2", *common, "--initial-caption", "a photo"]) == EXIT_INVALID
    assert "takes no initial caption" in capsys.readouterr().err
    # a model that cannot be loaded: exit 1, its name in the message
    assert generate_captions.main(["--model", "WD14_VIT_2", *common, "--model-path", str(folder)]) == EXIT_FAILED
    assert "model.onnx" in capsys.readouterr().err
    (model / "selected_tags.csv").write_text("no,header\n", encoding="utf-8")
    assert generate_captions.main(["--model", "WD14_VIT_2", *common, "--model-path", str(model)]) == EXIT_FAILED
    assert "tag list" in capsys.readouterr().err


def test_readme_shows_the_usage_texts():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert generate_masks.build_parser().format_help().strip() in readme
    assert generate_captions.build_parser().format_help().strip() in readme


@pytest.mark.slow
def test_scripts_run_as_subprocesses(tmp_path):
    folder = backdrop_folder(tmp_path)
    script = ROOT / "scripts" / "generate_masks.py"
    args = ["--model", "COLOR", "--sample-dir", str(folder), "--add-prompt", "#00ff00", "--device", "cpu"]
    result = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert (folder / "a-masklabel.png").exists()
    result = subprocess.run(
        [sys.executable, "-m", "onetrainer", "generate-captions", "--model", "NOPE", "--sample-dir", str(folder)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert result.returncode == 2 and "invalid choice" in result.stderr
