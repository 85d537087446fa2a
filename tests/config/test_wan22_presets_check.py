"""The shipped Wan 2.2 LoRA presets (both experts in one run, each in float8 with most of its blocks offloaded: 16 GB
with 21-frame clips, 24 GB with 33; OneTrainer ships none: it does not train Wan) pass `scripts/train.py --check`
over a folder of a clip and a still with the tiny local model, and their estimates stay under their cards."""

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

PRESETS = {"wan/wan22-lora-16gb": 16, "wan/wan22-lora-24gb": 24}


@pytest.mark.parametrize("name", PRESETS)
def test_the_wan22_presets_train_both_experts_and_pass_check_over_clips_and_a_still(in_tmp: Path, capsys, name):
    folder = in_tmp / "clips"
    write_clip(folder / "walk.mp4", frames=12, size=(64, 48))  # shorter than the presets' windows: trained shorter
    (folder / "walk.txt").write_text("a cat walks", encoding="utf-8")
    Image.new("RGB", (64, 48), (200, 30, 30)).save(folder / "still.png")
    (folder / "still.txt").write_text("a red square", encoding="utf-8")
    overrides = ["base_model_name=tiny:wan22", "concepts=" + json.dumps([{"name": "clips", "path": str(folder)}])]
    config, problems = load_layers(name, None, overrides)
    assert config.model_type is ModelType.WAN_2_2
    assert config.part("transformer").train and config.part("transformer_2").train
    assert config.part("transformer_2").weight_dtype.value == "FLOAT_8"
    problems += run_checks(config, include_schema=False)
    assert [p.message for p in problems if p.severity is Severity.ERROR] == []

    argv = ["--preset", name, *(arg for o in overrides for arg in ("--set", o)), "--check"]
    assert main(argv) == EXIT_OK
    assert "The config is valid." in capsys.readouterr().out


def test_the_recorded_estimates_fit_the_cards_the_presets_are_named_for():
    from onetrainer.benchmark.preset_memory import read_table

    table = read_table()
    for name, gigabytes in PRESETS.items():
        assert table[name]["model"] == "Wan 2.2" and table[name]["measured"]
        # a "24 GB" card has 24 GiB; what the driver and the desktop take of it is left free
        assert table[name]["vram_mib"] < 0.92 * gigabytes * 1024, name
