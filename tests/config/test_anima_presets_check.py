"""OneTrainer's own Anima presets (`tests/config/onetrainer_presets/Anima/`, unchanged: a LoRA with an INT_W8A8
transformer written as KOHYA_LORA, a fine-tune written as ORIGINAL_TRANSFORMER with Adafactor's fused back pass) pass
`scripts/train.py --check` with a local model: the base model pointed at `tiny:anima`, the concepts at a tiny image
folder, everything else as OneTrainer ships it (`compile: true` included)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from onetrainer.cli.train import EXIT_OK, main
from onetrainer.config import load_layers
from onetrainer.config.enums import DataType, ModelFormat, ModelType, TrainingMethod
from onetrainer.training.checks import Severity, run_checks
from tests.conftest import onetrainer_presets_dir
from tests.helpers import image_folder

FOLDER = onetrainer_presets_dir() / "Anima"
PRESETS = sorted(p.name for p in FOLDER.glob("*.json"))


def test_both_are_vendored():
    assert PRESETS == ["#anima Finetune.json", "#anima LoRA.json"]


@pytest.mark.parametrize("name", PRESETS)
def test_onetrainer_anima_presets_pass_check_with_a_local_model(in_tmp: Path, capsys, name):
    folder = image_folder(in_tmp, count=2)
    overrides = ["base_model_name=tiny:anima", "concepts=" + json.dumps([{"name": "shapes", "path": str(folder)}])]
    config, problems = load_layers(None, FOLDER / name, overrides)
    assert config.model_type is ModelType.ANIMA
    fine_tune = config.training_method is TrainingMethod.FINE_TUNE
    assert config.output_model_format is (ModelFormat.ORIGINAL_TRANSFORMER if fine_tune else ModelFormat.KOHYA_LORA)
    assert config.transformer.weight_dtype is (DataType.BFLOAT_16 if fine_tune else DataType.INT_W8A8)
    assert config.text_encoder.weight_dtype is DataType.FLOAT_8
    problems += run_checks(config, include_schema=False)
    assert [p.message for p in problems if p.severity is Severity.ERROR] == []

    argv = ["--config-path", str(FOLDER / name), *(arg for o in overrides for arg in ("--set", o)), "--check"]
    assert main(argv) == EXIT_OK
    assert "The config is valid." in capsys.readouterr().out
