"""OneTrainer's own Flux 2 presets (`tests/config/onetrainer_presets/Flux 2/`, unchanged: FLUX.2 [klein] base 9B,
LoRA at 8 and 16 GB, fine-tunes at 16 and 24 GB) pass `scripts/train.py --check` with a local model: the base model
pointed at `tiny:flux2-klein`, the concepts at a tiny image folder, everything else as OneTrainer ships it. `--check`
reports no error; its only warnings are about the remembered optimizer settings OneTrainer applies on load (the fused
back pass, stochastic rounding) and a fine-tune's offloaded transformer, each saying what to turn on.
Our own [dev] preset (`presets/flux2/lora-24gb-dev.json`) checks clean on `tiny:flux2-dev` and trains there."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from onetrainer.cli.train import EXIT_OK, main
from onetrainer.config import errors, load_layers
from onetrainer.training.checks import run_checks
from tests.conftest import onetrainer_presets_dir
from tests.helpers import image_folder

PRESETS = sorted((onetrainer_presets_dir() / "Flux 2").glob("*.json"))


def test_the_flux2_presets_are_there():
    assert [p.name for p in PRESETS] == [
        "#flux2 Finetune 16GB.json",
        "#flux2 Finetune 24GB.json",
        "#flux2 LoRA 16GB.json",
        "#flux2 LoRA 8GB.json",
    ]


@pytest.mark.parametrize("path", PRESETS, ids=lambda p: p.name)
def test_onetrainer_flux2_preset_passes_check_with_a_local_model(path: Path, in_tmp: Path, capsys):
    raw = json.loads(path.read_text(encoding="utf-8"))
    folder = image_folder(in_tmp, count=2)
    overrides = [
        "base_model_name=tiny:flux2-klein",
        "concepts=" + json.dumps([{"name": "shapes", "path": str(folder)}]),
    ]
    config, problems = load_layers(None, path, overrides)
    problems += run_checks(config, include_schema=False)
    assert errors(problems) == []
    warned = {p.path for p in problems if not p.is_error}
    expected = set()
    if raw["training_method"] == "FINE_TUNE":
        expected |= {"optimizer_defaults.ADAFACTOR.fused_back_pass", "optimizer_defaults.ADAFACTOR.stochastic_rounding"}
        if raw["transformer"].get("offload_fraction"):
            expected.add("transformer.offload_fraction")
    assert warned == expected, [p.message for p in problems]

    argv = ["--config-path", str(path), *(arg for o in overrides for arg in ("--set", o)), "--check"]
    assert main(argv) == EXIT_OK
    out, err = capsys.readouterr()
    assert "The config is valid." in out and all(p in err for p in expected), err


def test_our_flux2_dev_preset_checks_clean_and_trains_a_lora_on_the_tiny_dev_model(in_tmp: Path):
    """The shipped FLUX.2 [dev] LoRA preset (`presets/flux2/lora-24gb-dev.json`: the transformer in FLOAT_8 with 70 % of
    its blocks in CPU memory, the Mistral text encoder frozen in FLOAT_8, 90 % offloaded, its outputs cached) passes
    the checks with no warning on `tiny:flux2-dev` and trains there: the LoRA file holds the transformer's blocks."""
    from safetensors.torch import load_file

    from onetrainer.training.events import Metrics
    from tests.helpers import run_config

    folder = image_folder(in_tmp, count=2)
    overrides = [
        "base_model_name=tiny:flux2-dev",
        "concepts=" + json.dumps([{"name": "shapes", "path": str(folder)}]),
    ]
    config, problems = load_layers("flux2/lora-24gb-dev", None, overrides)
    assert config.base_model_name == "tiny:flux2-dev" and config.transformer.offload_fraction > 0
    problems += run_checks(config, include_schema=False)
    assert problems == [], [p.message for p in problems]

    destination = in_tmp / "out" / "lora.safetensors"
    data = {
        **config.to_dict(),
        "resolution": "64",
        "epochs": 1,
        "workspace_dir": str(in_tmp / "workspace"),
        "cache_dir": str(in_tmp / "cache"),
        "output_model_destination": str(destination),
        "tensorboard": False,
        "train_device": "cpu",
        "dataloader_threads": 0,
    }
    events = run_config(data)
    assert any(isinstance(e, Metrics) for e in events)
    modules = {k.rpartition(".lora_")[0] for k in load_file(str(destination))}
    assert modules and all(
        m.startswith(("transformer.transformer_blocks.", "transformer.single_transformer_blocks.")) for m in modules
    )
