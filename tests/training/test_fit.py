"""A run fitted to a VRAM budget (`training/fit.py`): the cheapest changes first, each an ordinary config value, the
search stopping once the estimate fits; `scripts/train.py --fit-vram` applies them and says what it changed."""

from __future__ import annotations

import json

import pytest

from onetrainer.config import config_from_dict, load_layers
from onetrainer.config.enums import DataType, Optimizer
from onetrainer.training.estimate import Estimate, estimate
from onetrainer.training.fit import GIB, apply, fit_to_budget


def _flux_lora():
    config, _ = config_from_dict({
        "model_type": "FLUX_DEV_1", "training_method": "LORA", "output_model_format": "KOHYA_LORA",
        "base_model_name": "black-forest-labs/FLUX.1-dev", "resolution": "512", "batch_size": 2,
        "latent_caching": True, "transformer": {"weight_dtype": "FLOAT_8"},
        "text_encoder": {"train": False, "weight_dtype": "BFLOAT_16"},
        "text_encoder_2": {"train": False, "weight_dtype": "FLOAT_8"},
    })  # fmt: skip
    return config


def test_a_flux_lora_is_fitted_to_8_gib_with_layer_offloading():
    config = _flux_lora()
    before = estimate(config, device="cuda").peak_bytes
    fit = fit_to_budget(config, 8 * GIB)
    assert before > 8 * GIB and fit.fits and fit.estimate.peak_bytes <= 8 * GIB
    changed = {c.path: c.after for c in fit.changes}
    assert changed["optimizer.optimizer"] is Optimizer.ADAMW_8BIT
    assert 0 < changed["transformer.offload_fraction"] <= 0.9
    assert config.transformer.offload_fraction == 0  # the config itself is untouched
    apply(config, fit.changes)
    assert estimate(config, device="cuda").peak_bytes == pytest.approx(fit.estimate.peak_bytes)
    assert "fitted to 8.0 GiB" in fit.text() and "transformer.offload_fraction: 0.0 →" in fit.text()


def test_a_config_that_fits_is_left_alone_and_one_that_cannot_says_so():
    config = _flux_lora()
    roomy = fit_to_budget(config, 200 * GIB)
    assert roomy.fits and roomy.changes == [] and "as it is" in roomy.text()
    hopeless = fit_to_budget(config, 1 * GIB)
    assert not hopeless.fits and hopeless.changes and "cannot fit 1.0 GiB" in hopeless.text()


def test_a_flux_fine_tune_is_fitted_to_16_gib_with_the_fused_back_pass_and_its_blocks_offloaded():
    config, _ = config_from_dict({
        "model_type": "FLUX_DEV_1", "training_method": "FINE_TUNE", "output_model_format": "ORIGINAL_TRANSFORMER",
        "base_model_name": "black-forest-labs/FLUX.1-dev", "resolution": "512", "batch_size": 1,
        "train_dtype": "BFLOAT_16", "latent_caching": True, "optimizer": {"optimizer": "ADAFACTOR"},
        "transformer": {"weight_dtype": "BFLOAT_16"},
        "text_encoder": {"train": False, "weight_dtype": "BFLOAT_16"},
        "text_encoder_2": {"train": False, "weight_dtype": "FLOAT_8"},
    })  # fmt: skip
    fit = fit_to_budget(config, 16 * GIB)
    changed = {c.path: c.after for c in fit.changes}
    assert fit.fits and changed["optimizer.fused_back_pass"] is True
    assert "optimizer.optimizer" not in changed  # an 8-bit optimizer cannot update each weight on its own
    assert changed["transformer.offload_fraction"] > 0  # the trained transformer's blocks move (fused back pass)
    assert "transformer.weight_dtype" not in changed  # trained weights stay BFLOAT_16
    # Offloaded trained layers are refused beside an EMA: the fit leaves them on the GPU then.
    config.ema = config.ema.__class__("CPU")
    with_ema = {c.path for c in fit_to_budget(config, 16 * GIB).changes}
    assert "transformer.offload_fraction" not in with_ema


def _fake_estimate(config) -> Estimate:
    """A peak that each setting the fit may change lowers by a known amount."""
    gib = 20.0
    gib -= 2 if config.optimizer.optimizer.value.endswith("_8BIT") else 0
    gib -= 3 if config.transformer.gradient_checkpointing else 0
    gib -= 4 if config.transformer.weight_dtype is DataType.FLOAT_8 else 0
    gib -= 0.5 if config.transformer.activation_offloading else 0
    gib -= 8 * config.transformer.offload_fraction
    gib -= 1 if config.batch_size == 1 else 0
    return Estimate(gib * GIB, None, {}, device="cuda")


@pytest.mark.parametrize(
    ("budget", "last"),
    [(18.5, "optimizer.optimizer"), (15.5, "transformer.gradient_checkpointing"), (11.5, "transformer.weight_dtype"),
     (9.75, "transformer.activation_offloading"), (8.0, "transformer.offload_fraction")],
)  # fmt: skip
def test_the_cheapest_changes_come_first_and_the_search_stops_when_it_fits(budget, last):
    config, _ = config_from_dict({
        "model_type": "FLUX_DEV_1", "training_method": "LORA", "output_model_format": "KOHYA_LORA",
        "latent_caching": True, "transformer": {"gradient_checkpointing": False, "weight_dtype": "BFLOAT_16"},
        "text_encoder": {"train": False, "weight_dtype": "FLOAT_8"}, "text_encoder_2": {"train": False},
    })  # fmt: skip
    fit = fit_to_budget(config, budget * GIB, estimate_of=_fake_estimate)
    paths = {c.path for c in fit.changes}
    order = ["optimizer.optimizer", "transformer.gradient_checkpointing", "transformer.weight_dtype",
             "transformer.activation_offloading", "transformer.offload_fraction", "batch_size"]  # fmt: skip
    assert fit.fits and last in paths and not paths & set(order[order.index(last) + 1 :])
    if last == "transformer.offload_fraction":
        # batch 1: 20 - 2 - 3 - 4 - 0.5 - 1 = 9.5 GiB before offloading; 8 GiB needs 3/16 of the blocks off
        assert {c.path: c.after for c in fit.changes}[last] == 0.2


def test_train_py_fits_the_run_and_prints_each_change(tmp_path, capsys):
    from onetrainer.cli.train import EXIT_INVALID, EXIT_OK, main
    from tests.helpers import image_folder

    folder = image_folder(tmp_path, count=2)
    sets = [
        "base_model_name=black-forest-labs/FLUX.1-dev",
        "offline_mode=true",
        "concepts=" + json.dumps([{"name": "a", "path": str(folder)}]),
    ]
    argv = ["--preset", "flux/lora-24gb", *(a for s in sets for a in ("--set", s)), "--fit-vram", "9", "--check"]
    code = main(argv)
    out = capsys.readouterr().out
    assert "--fit-vram 9: fitted to 9.0 GiB" in out and "transformer.offload_fraction" in out
    assert code in (EXIT_OK, EXIT_INVALID)  # the hub model is not cached here (offline): --check may refuse that
    assert main([*argv[:-3], "--fit-vram", "0.5", "--check"]) == EXIT_INVALID
    assert "cannot fit 0.5 GiB" in capsys.readouterr().out
    config, _ = load_layers("flux/lora-24gb", None, [])
    assert config.transformer.offload_fraction == 0  # the preset file is never changed
