"""OneTrainer's own Sana preset (`tests/config/onetrainer_presets/Sana/`, unchanged: the 1.6B model's fine-tune) passes
`scripts/train.py --check` with a local model: the base model pointed at `tiny:sana`, the concepts at a tiny image
folder, everything else as OneTrainer ships it, with no error and no warning."""

from __future__ import annotations

import json
from pathlib import Path

from onetrainer.cli.train import EXIT_OK, main
from onetrainer.config import load_layers
from onetrainer.config.enums import ModelFormat, ModelType, TrainingMethod
from onetrainer.training.checks import run_checks
from tests.conftest import onetrainer_presets_dir
from tests.helpers import image_folder

PRESET = onetrainer_presets_dir() / "Sana" / "#sana 1.6b.json"


def test_onetrainer_sana_preset_passes_check_with_a_local_model(in_tmp: Path, capsys):
    folder = image_folder(in_tmp, count=2)
    overrides = ["base_model_name=tiny:sana", "concepts=" + json.dumps([{"name": "shapes", "path": str(folder)}])]
    config, problems = load_layers(None, PRESET, overrides)
    assert config.model_type is ModelType.SANA and config.training_method is TrainingMethod.FINE_TUNE
    assert config.output_model_format is ModelFormat.DIFFUSERS
    problems += run_checks(config, include_schema=False)
    assert problems == [], [p.message for p in problems]

    argv = ["--config-path", str(PRESET), *(arg for o in overrides for arg in ("--set", o)), "--check"]
    assert main(argv) == EXIT_OK
    assert "The config is valid." in capsys.readouterr().out
