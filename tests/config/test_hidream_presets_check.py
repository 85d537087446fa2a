"""OneTrainer's own HiDream preset (`tests/config/onetrainer_presets/HiDream Full/`, unchanged: a LoRA with FLOAT_8
parts, half of the transformer's, T5's and Llama's blocks offloaded, Llama named by its hub id) passes
`scripts/train.py --check` with a local model: the base model pointed at `tiny:hidream` (which brings its own Llama,
so the preset's hub id for it goes unused), the concepts at a tiny image folder, everything else as OneTrainer ships
it."""

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

FOLDER = onetrainer_presets_dir() / "HiDream Full"
PRESETS = sorted(p.name for p in FOLDER.glob("*.json"))


def test_the_one_preset_is_vendored():
    assert PRESETS == ["#hidream LoRA.json"]


@pytest.mark.parametrize("name", PRESETS)
def test_onetrainer_hidream_presets_pass_check_with_a_local_model(in_tmp: Path, capsys, name):
    folder = image_folder(in_tmp, count=2)
    overrides = ["base_model_name=tiny:hidream", "concepts=" + json.dumps([{"name": "shapes", "path": str(folder)}])]
    config, problems = load_layers(None, FOLDER / name, overrides)
    assert config.model_type is ModelType.HI_DREAM_FULL
    assert config.training_method is TrainingMethod.LORA
    assert config.output_model_format is ModelFormat.DIFFUSERS_LORA
    assert config.text_encoder_4.model_name == "meta-llama/Llama-3.1-8B-Instruct"
    assert config.text_encoder_4.weight_dtype is DataType.FLOAT_8 and config.text_encoder_4.offload_fraction == 0.5
    problems += run_checks(config, include_schema=False)
    assert [p.message for p in problems if p.severity is Severity.ERROR] == []

    argv = ["--config-path", str(FOLDER / name), *(arg for o in overrides for arg in ("--set", o)), "--check"]
    assert main(argv) == EXIT_OK
    assert "The config is valid." in capsys.readouterr().out
