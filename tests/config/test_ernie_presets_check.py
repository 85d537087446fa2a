"""OneTrainer's own ERNIE-Image presets (`tests/config/onetrainer_presets/Ernie Image/`, unchanged: LoRA at 8 and 16 GB:
INT_W8A8 transformer with `compile`, FLOAT_8 Ministral, the 8 GB one with 70 % of the transformer's blocks offloaded)
pass `scripts/train.py --check` with a local model: the base model pointed at `tiny:ernie`, the concepts at a tiny
image folder, everything else as OneTrainer ships it, with no error and no warning."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from onetrainer.cli.train import EXIT_OK, main
from onetrainer.config import load_layers
from onetrainer.config.enums import ModelFormat, ModelType, TrainingMethod
from onetrainer.training.checks import run_checks
from tests.conftest import onetrainer_presets_dir
from tests.helpers import image_folder

PRESETS = sorted((onetrainer_presets_dir() / "Ernie Image").glob("*.json"))


def test_the_ernie_presets_are_there():
    assert [p.name for p in PRESETS] == ["#ernie LoRA 16GB.json", "#ernie LoRA 8GB.json"]


@pytest.mark.parametrize("path", PRESETS, ids=lambda p: p.name)
def test_onetrainer_ernie_preset_passes_check_with_a_local_model(path: Path, in_tmp: Path, capsys):
    folder = image_folder(in_tmp, count=2)
    overrides = ["base_model_name=tiny:ernie", "concepts=" + json.dumps([{"name": "shapes", "path": str(folder)}])]
    config, problems = load_layers(None, path, overrides)
    assert config.model_type is ModelType.ERNIE and config.training_method is TrainingMethod.LORA
    assert config.output_model_format is ModelFormat.DIFFUSERS_LORA
    assert config.layer_filter_preset == "attn-mlp"
    problems += run_checks(config, include_schema=False)
    assert problems == [], [p.message for p in problems]

    argv = ["--config-path", str(path), *(arg for o in overrides for arg in ("--set", o)), "--check"]
    assert main(argv) == EXIT_OK
    assert "The config is valid." in capsys.readouterr().out
