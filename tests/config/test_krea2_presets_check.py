"""OneTrainer's own Krea 2 presets (`tests/config/onetrainer_presets/Krea 2/`, unchanged: LoRA 16 / 24 GB with an
INT_W8A8 transformer, fine-tunes 16 / 24 GB written as ORIGINAL_TRANSFORMER) pass `scripts/train.py --check` with a
local model: the base model pointed at `tiny:krea2`, the concepts at a tiny image folder, everything else as OneTrainer
ships it, their `attention_mechanism: CUDNN` included (cuDNN's attention kernel first, `training/attention.py`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from onetrainer.cli.train import EXIT_OK, main
from onetrainer.config import load_layers
from onetrainer.config.enums import AttentionMechanism, ModelFormat, ModelType, TrainingMethod
from onetrainer.training.checks import Severity, run_checks
from tests.conftest import onetrainer_presets_dir
from tests.helpers import image_folder

FOLDER = onetrainer_presets_dir() / "Krea 2"
PRESETS = sorted(p.name for p in FOLDER.glob("*.json"))


def test_all_four_are_vendored():
    assert PRESETS == [
        "#krea2 Finetune 16GB.json",
        "#krea2 Finetune 24GB.json",
        "#krea2 LoRA 16GB.json",
        "#krea2 LoRA 24GB.json",
    ]


@pytest.mark.parametrize("name", PRESETS)
def test_onetrainer_krea2_presets_pass_check_with_a_local_model(in_tmp: Path, capsys, name):
    folder = image_folder(in_tmp, count=2)
    overrides = ["base_model_name=tiny:krea2", "concepts=" + json.dumps([{"name": "shapes", "path": str(folder)}])]
    config, problems = load_layers(None, FOLDER / name, overrides)
    assert config.model_type is ModelType.KREA_2
    fine_tune = config.training_method is TrainingMethod.FINE_TUNE
    expected = ModelFormat.ORIGINAL_TRANSFORMER if fine_tune else ModelFormat.DIFFUSERS_LORA
    assert config.output_model_format is expected
    assert config.attention_mechanism is AttentionMechanism.CUDNN
    problems += run_checks(config, include_schema=False)
    assert [p.message for p in problems if p.severity is Severity.ERROR] == []

    argv = ["--config-path", str(FOLDER / name), *(arg for o in overrides for arg in ("--set", o)), "--check"]
    assert main(argv) == EXIT_OK
    assert "The config is valid." in capsys.readouterr().out
