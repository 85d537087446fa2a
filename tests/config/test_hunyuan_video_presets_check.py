"""The shipped HunyuanVideo LoRA presets (16 GB: 17-frame clips at 512 px, the transformer in float8 with three
quarters of its blocks offloaded; 24 GB: 33-frame clips, a quarter offloaded) and OneTrainer's own HunyuanVideo preset
(`tests/config/onetrainer_presets/Hunyuan Video/`, unchanged: a COMFY_LORA on the `blocks` preset, FLOAT_8 parts, half
of the transformer's and the Llama's blocks offloaded, batch 4 at 512 px) pass `scripts/train.py --check` over a
folder of a clip and a still with the tiny local model (the base model pointed at `tiny:hunyuan-video`, the concepts at
the folder, everything else as shipped)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

from onetrainer.cli.train import EXIT_OK, main
from onetrainer.config import load_layers
from onetrainer.config.enums import DataType, ModelFormat, ModelType, TrainingMethod
from onetrainer.training.checks import Severity, run_checks
from tests.conftest import onetrainer_presets_dir
from tests.data.test_video_concepts import write_clip

PRESETS = ("hunyuan_video/lora-16gb", "hunyuan_video/lora-24gb")
FOLDER = onetrainer_presets_dir() / "Hunyuan Video"
ONETRAINER_PRESETS = sorted(p.name for p in FOLDER.glob("*.json"))


def clips(root: Path) -> list[str]:
    """`--set` overrides: the tiny model and a concept of a clip and a still."""
    folder = root / "clips"
    write_clip(folder / "walk.mp4", frames=12, size=(64, 48))  # shorter than the presets' windows: trained shorter
    (folder / "walk.txt").write_text("a cat walks", encoding="utf-8")
    Image.new("RGB", (64, 48), (200, 30, 30)).save(folder / "still.png")
    (folder / "still.txt").write_text("a red square", encoding="utf-8")
    return ["base_model_name=tiny:hunyuan-video", "concepts=" + json.dumps([{"name": "clips", "path": str(folder)}])]


def assert_checks_pass(config, problems) -> None:
    problems = problems + run_checks(config, include_schema=False)
    assert [p.message for p in problems if p.severity is Severity.ERROR] == []


@pytest.mark.parametrize("name", PRESETS)
def test_the_hunyuan_video_presets_pass_check_over_clips_and_a_still(in_tmp: Path, capsys, name):
    overrides = clips(in_tmp)
    config, problems = load_layers(name, None, overrides)
    assert config.model_type is ModelType.HUNYUAN_VIDEO and config.frames in ("17", "33")
    assert config.transformer.weight_dtype is DataType.FLOAT_8
    assert_checks_pass(config, problems)

    argv = ["--preset", name, *(arg for o in overrides for arg in ("--set", o)), "--check"]
    assert main(argv) == EXIT_OK
    assert "The config is valid." in capsys.readouterr().out


def test_the_one_onetrainer_preset_is_vendored():
    assert ONETRAINER_PRESETS == ["#hunyuan video LoRA.json"]


@pytest.mark.parametrize("name", ONETRAINER_PRESETS)
def test_onetrainer_hunyuan_video_presets_pass_check_with_a_local_model(in_tmp: Path, capsys, name):
    overrides = clips(in_tmp)
    config, problems = load_layers(None, FOLDER / name, overrides)
    assert config.model_type is ModelType.HUNYUAN_VIDEO
    assert config.training_method is TrainingMethod.LORA
    assert config.output_model_format is ModelFormat.COMFY_LORA and config.layer_filter_preset == "blocks"
    assert config.transformer.weight_dtype is DataType.FLOAT_8 and config.transformer.offload_fraction == 0.5
    assert config.text_encoder.offload_fraction == 0.5 and config.text_encoder_2.weight_dtype is DataType.FLOAT_8
    assert_checks_pass(config, problems)

    argv = ["--config-path", str(FOLDER / name), *(arg for o in overrides for arg in ("--set", o)), "--check"]
    assert main(argv) == EXIT_OK
    assert "The config is valid." in capsys.readouterr().out
