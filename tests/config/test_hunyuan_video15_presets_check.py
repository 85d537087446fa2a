"""The shipped HunyuanVideo 1.5 LoRA presets (16 GB: the 8.3B transformer in float8 with half its blocks offloaded,
Qwen2.5-VL in 4 bits, 33-frame clips; 24 GB: the transformer and Qwen2.5-VL in float8, 49-frame clips; OneTrainer
ships none: it does not train HunyuanVideo 1.5) pass `scripts/train.py --check` over a folder of a clip and a still
with the tiny local model (their NFLOAT_4 parts in FLOAT_8 on a machine without CUDA, which bitsandbytes' 4-bit
kernels need)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

from onetrainer.cli.train import EXIT_OK, main
from onetrainer.config import load_layers
from onetrainer.config.enums import ModelType
from onetrainer.training.checks import Severity, run_checks
from tests.data.test_video_concepts import write_clip
from tests.helpers import nf4_stand_ins

PRESETS = ("hunyuan_video15/lora-16gb", "hunyuan_video15/lora-24gb")


@pytest.mark.parametrize("name", PRESETS)
def test_the_hunyuan_video15_presets_pass_check_over_clips_and_a_still(in_tmp: Path, capsys, name):
    folder = in_tmp / "clips"
    write_clip(folder / "walk.mp4", frames=12, size=(64, 48))  # shorter than the presets' windows: trained shorter
    (folder / "walk.txt").write_text('a cat walks past a sign "OPEN"', encoding="utf-8")
    Image.new("RGB", (64, 48), (200, 30, 30)).save(folder / "still.png")
    (folder / "still.txt").write_text("a red square", encoding="utf-8")
    overrides = [
        "base_model_name=tiny:hunyuan-video15",
        "concepts=" + json.dumps([{"name": "clips", "path": str(folder)}]),
    ]
    config, _ = load_layers(name, None, overrides)
    overrides += [f"{key}={value}" for key, value in nf4_stand_ins(config).items()]  # NFLOAT_4 needs CUDA
    config, problems = load_layers(name, None, overrides)
    assert config.model_type is ModelType.HUNYUAN_VIDEO_15
    assert config.frames in ("33", "49") and config.timestep_shift == 5.0
    problems += run_checks(config, include_schema=False)
    assert [p.message for p in problems if p.severity is Severity.ERROR] == []

    argv = ["--preset", name, *(arg for o in overrides for arg in ("--set", o)), "--check"]
    assert main(argv) == EXIT_OK
    assert "The config is valid." in capsys.readouterr().out
