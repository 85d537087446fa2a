"""OneTrainer's own Ideogram 4 presets (`tests/config/onetrainer_presets/Ideogram 4/`, unchanged: LoRA 16 / 24 GB with
an INT_W8A8 transformer written as COMFY_LORA, fine-tunes 16 / 24 GB written as ORIGINAL_TRANSFORMER; the
unconditional transformer in NFLOAT_4, the text encoder too) pass `scripts/train.py --check` with a local model: the
base model pointed at `tiny:ideogram4`, the concepts at a tiny image folder, everything else as OneTrainer ships it
(their NFLOAT_4 parts in FLOAT_8 on a machine without CUDA, which bitsandbytes' 4-bit kernels need; the unconditional
transformer's `offload_fraction` 1.0 as shipped: layer offloading is not built for that part, a warning says so)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from onetrainer.cli.train import EXIT_OK, main
from onetrainer.config import load_layers
from onetrainer.config.enums import ModelFormat, ModelType, TrainingMethod
from onetrainer.training.checks import Severity, run_checks
from tests.conftest import onetrainer_presets_dir
from tests.helpers import image_folder, nf4_stand_ins

FOLDER = onetrainer_presets_dir() / "Ideogram 4"
PRESETS = sorted(p.name for p in FOLDER.glob("*.json"))


def test_all_four_are_vendored():
    assert PRESETS == [
        "#ideogram Finetune 16GB.json",
        "#ideogram Finetune 24GB.json",
        "#ideogram LoRA 16GB.json",
        "#ideogram LoRA 24GB.json",
    ]


@pytest.mark.parametrize("name", PRESETS)
def test_onetrainer_ideogram4_presets_pass_check_with_a_local_model(in_tmp: Path, capsys, name):
    folder = image_folder(in_tmp, count=2)
    overrides = ["base_model_name=tiny:ideogram4", "concepts=" + json.dumps([{"name": "shapes", "path": str(folder)}])]
    config, _ = load_layers(None, FOLDER / name, overrides)
    overrides += [f"{key}={value}" for key, value in nf4_stand_ins(config).items()]
    config, problems = load_layers(None, FOLDER / name, overrides)
    assert config.model_type is ModelType.IDEOGRAM_4
    fine_tune = config.training_method is TrainingMethod.FINE_TUNE
    expected = ModelFormat.ORIGINAL_TRANSFORMER if fine_tune else ModelFormat.COMFY_LORA
    assert config.output_model_format is expected
    assert json.loads((FOLDER / name).read_text())["unconditional_transformer"]["weight_dtype"] == "NFLOAT_4"
    assert config.unconditional_transformer.offload_fraction == 1.0
    problems += run_checks(config, include_schema=False)
    assert [p.message for p in problems if p.severity is Severity.ERROR] == []

    argv = ["--config-path", str(FOLDER / name), *(arg for o in overrides for arg in ("--set", o)), "--check"]
    assert main(argv) == EXIT_OK
    assert "The config is valid." in capsys.readouterr().out
