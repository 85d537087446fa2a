"""OneTrainer's own Flux Dev.1 and Chroma presets pass `scripts/train.py --check` with a local model.

Each vendored preset (`tests/config/onetrainer_presets/`, unchanged) is checked as a user would run it offline: the
base model pointed at the tiny model of its type, the concepts at a tiny image folder, everything else as OneTrainer
ships it. `--check` must report no error, and a warning for each memory feature the preset asks for that is not built
here (layer offloading, the quantization layer filter, the fused back pass, stochastic rounding), each saying what the
run does instead. The one exception is the machine's: NFLOAT_4 (OneTrainer's Flux LoRA preset) needs bitsandbytes'
CUDA kernels, so without a CUDA device that weight dtype is an error naming CUDA and FLOAT_8.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from onetrainer.cli.train import EXIT_INVALID, EXIT_OK, main
from onetrainer.config import errors, load_layers
from onetrainer.training.checks import run_checks
from tests.config.test_flow_presets import _expected_not_built
from tests.conftest import onetrainer_presets_dir
from tests.helpers import TINY_MODELS, image_folder

PRESETS = sorted(p for family in ("Flux Dev.1", "Chroma") for p in (onetrainer_presets_dir() / family).glob("*.json"))


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _machine_errors(raw: dict) -> set[str]:
    """The errors this machine gives the preset: NFLOAT_4 parts without a CUDA device."""
    nf4 = {f"{part}.weight_dtype" for part, block in raw.items() if isinstance(block, dict)}
    nf4 = {path for path in nf4 if raw[path.split(".")[0]].get("weight_dtype") == "NFLOAT_4"}
    return set() if _cuda() else nf4


def test_the_flux_and_chroma_presets_are_there():
    assert {p.parent.name for p in PRESETS} == {"Flux Dev.1", "Chroma"} and len(PRESETS) == 7


@pytest.mark.parametrize("path", PRESETS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_onetrainer_flux_preset_passes_check_with_a_local_model(path: Path, in_tmp: Path, capsys):
    raw = json.loads(path.read_text(encoding="utf-8"))
    folder = image_folder(in_tmp, count=2)
    overrides = [
        f"base_model_name=tiny:{TINY_MODELS[raw['model_type']]}",
        "concepts=" + json.dumps([{"name": "shapes", "path": str(folder)}]),
    ]
    config, problems = load_layers(None, path, overrides)
    problems += run_checks(config, include_schema=False)

    machine = _machine_errors(raw)
    assert {p.path for p in errors(problems)} == machine, [p.message for p in errors(problems)]
    for problem in errors(problems):  # NFLOAT_4 without CUDA: what to choose instead
        assert "NFLOAT_4 weights need bitsandbytes' CUDA kernels" in problem.message and "FLOAT_8" in problem.message
    warned = {p.path: p.message for p in problems if not p.is_error}
    expected = _expected_not_built(raw)
    assert set(warned) == expected, warned  # nothing else: no unknown key, no ignored setting, no stale value
    assert all("is not built yet; " in warned[p] for p in expected)

    # The command line says the same: the exit code, each warning by its path, "valid" when nothing is refused.
    argv = ["--config-path", str(path), *(arg for o in overrides for arg in ("--set", o)), "--check"]
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == (EXIT_INVALID if machine else EXIT_OK), err
    assert all(p in err for p in expected | machine), err
    assert ("The config is valid." in out) is not machine


def test_what_check_says_for_onetrainer_flux_presets(in_tmp: Path, capsys):
    # The words a user reads for the memory features OneTrainer's Chroma presets rely on.
    folder = image_folder(in_tmp, count=2)
    path = onetrainer_presets_dir() / "Chroma" / "#chroma Finetune 8GB.json"
    sets = ["base_model_name=tiny:chroma", "concepts=" + json.dumps([{"name": "shapes", "path": str(folder)}])]
    assert main(["--config-path", str(path), *(a for s in sets for a in ("--set", s)), "--check"]) == EXIT_OK
    err = capsys.readouterr().err
    assert (
        "offload_fraction 0.85 on the transformer: layer offloading is not built yet; the whole transformer stays on "
        "the GPU" in err
    )
    assert "fused_back_pass true in the ADAFACTOR settings OneTrainer applies on load: the fused back pass" in err
    assert (
        "stochastic_rounding true in the ADAFACTOR settings OneTrainer applies on load: stochastic rounding (an "
        "update to BFLOAT_16 weights rounded up or down at random, so small updates add up) is not built yet; "
        "updates round to the nearest BFLOAT_16 value" in err
    )
