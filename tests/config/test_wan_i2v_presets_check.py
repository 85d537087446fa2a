"""The shipped Wan 2.1 I2V LoRA presets (24 GB: the 14B 480p model in float8 with half its blocks offloaded,
33-frame clips; 16 GB: 80 % offloaded, 17-frame clips, rank 16; OneTrainer ships none: it does not train Wan) each
pass `scripts/train.py --check` over a folder of a clip and a still with the tiny local model, a sample with its start
image; without one the check names the sample's field."""

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

PRESETS = {"wan/i2v-lora-16gb": "17", "wan/i2v-lora-24gb": "33"}  # each preset and its frames


@pytest.mark.parametrize("preset", PRESETS)
def test_the_wan_i2v_preset_passes_check_over_clips_with_a_samples_start_image(preset: str, in_tmp: Path, capsys):
    folder = in_tmp / "clips"
    write_clip(folder / "walk.mp4", frames=12, size=(64, 48))  # shorter than the preset's windows: trained shorter
    (folder / "walk.txt").write_text("a cat walks", encoding="utf-8")
    Image.new("RGB", (64, 48), (200, 30, 30)).save(folder / "still.png")
    (folder / "still.txt").write_text("a red square", encoding="utf-8")
    sample = {"prompt": "a cat walks", "frames": 5, "reference_images": [str(folder / "still.png")]}
    overrides = ["base_model_name=tiny:wan21-i2v", "concepts=" + json.dumps([{"name": "clips", "path": str(folder)}]),
                 "samples=" + json.dumps([sample])]  # fmt: skip
    config, problems = load_layers(preset, None, overrides)
    assert config.model_type is ModelType.WAN_2_1_I2V and config.frames == PRESETS[preset]
    problems += run_checks(config, include_schema=False)
    assert [p.message for p in problems if p.severity is Severity.ERROR] == []

    argv = ["--preset", preset, *(arg for o in overrides for arg in ("--set", o)), "--check"]
    assert main(argv) == EXIT_OK
    assert "The config is valid." in capsys.readouterr().out

    without = [*overrides[:2], "samples=" + json.dumps([{"prompt": "a cat walks", "frames": 5}])]
    config, problems = load_layers(preset, None, without)
    assert any(p.path == "samples.0.reference_images" for p in problems if p.is_error)
