"""A run fitted to a VRAM budget (`training/fit.py`): the cheapest changes first, each an ordinary config value, the
search stopping once the estimate fits; `scripts/train.py --fit-vram` applies them and says what it changed."""

from __future__ import annotations

import json

import pytest

from onetrainer.config import config_from_dict, load_layers
from onetrainer.config.enums import DataType, MultiGpuMode, Optimizer
from onetrainer.training.estimate import MIB, Estimate, estimate
from onetrainer.training.fit import GIB, Fit, apply, fit_to_budget


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


def _flux_full_fine_tune():
    """Flux's transformer fine-tuned in float32 with AdamW: about 180 GiB on one GPU, 44 GiB of it the weights."""
    config, _ = config_from_dict({
        "model_type": "FLUX_DEV_1", "training_method": "FINE_TUNE", "output_model_format": "ORIGINAL_TRANSFORMER",
        "base_model_name": "black-forest-labs/FLUX.1-dev", "resolution": "512", "batch_size": 1,
        "train_dtype": "BFLOAT_16", "latent_caching": True, "optimizer": {"optimizer": "ADAMW"},
        "transformer": {"weight_dtype": "FLOAT_32"},
        "text_encoder": {"train": False, "weight_dtype": "BFLOAT_16"},
        "text_encoder_2": {"train": False, "weight_dtype": "FLOAT_8"},
    })  # fmt: skip
    return config


def test_a_full_fine_tune_too_big_for_one_gpu_is_sharded_over_the_machines_gpus():
    """On one GPU the fit takes the fused back pass and layer offloading; with 4 GPUs it shards instead (and drops
    the fused back pass, which sharding does not combine with), a change the estimate of the applied config agrees
    with; with 2 GPUs the shards must wait in host RAM too. An EMA on the GPU is sharded too: a quarter of its copy
    on each of 4 GPUs."""
    config = _flux_full_fine_tune()
    alone = fit_to_budget(config, 80 * GIB)
    assert alone.fits and "multi_gpu_mode" not in {c.path for c in alone.changes}
    assert {c.path: c.after for c in alone.changes}["optimizer.fused_back_pass"] is True

    four = fit_to_budget(config, 80 * GIB, gpus=4)
    changed = {c.path: c.after for c in four.changes}
    assert four.fits and changed == {"multi_gpu": True, "multi_gpu_mode": MultiGpuMode.SHARDED,
                                     "device_indexes": "0,1,2,3"}  # fmt: skip
    assert "split over 4 GPUs" in four.text() and four.estimate.mode == "sharded"
    assert four.estimate.peak_bytes <= 80 * GIB < four.estimate.modes["data parallel"]
    applied = config.copy()
    apply(applied, four.changes)
    assert estimate(applied, device="cuda").peak_bytes == pytest.approx(four.estimate.peak_bytes)

    two = {c.path: c.after for c in fit_to_budget(config, 80 * GIB, gpus=2).changes}
    assert two["multi_gpu_mode"] is MultiGpuMode.SHARDED and two["sharded_cpu_offload"] is True
    assert two["device_indexes"] == "0,1"

    without = estimate(config, device="cuda").parts["training state"]
    config.ema = config.ema.__class__("GPU")
    copy = estimate(config, device="cuda").parts["training state"] - without  # the EMA's float32 copy, in one process
    with_ema = fit_to_budget(config, 80 * GIB, gpus=4)
    assert with_ema.fits and with_ema.estimate.mode == "sharded" and copy > 0

    def shards(fit) -> float:
        return next(v for k, v in fit.estimate.parts.items() if k.startswith("shards"))

    assert shards(with_ema) - shards(four) == pytest.approx(copy / 4)


def test_a_shipped_fine_tune_that_offloads_and_rounds_is_sharded_with_what_sharding_needs():
    """Flux.2 [dev]'s 48 GB fine-tune (fused back pass, half the transformer's blocks offloaded, BFLOAT_16 weights
    rounded stochastically), fitted to 24 GiB on 4 GPUs: sharded, which takes the fused back pass and the offloading
    off (sharding replaces both) and keeps the transformer in FLOAT_32 (sharding does not round stochastically; the
    weights are computed in BFLOAT_16), each change said; the result passes the sharded checks and is estimated as
    fitted. On one GPU it does not fit at all."""
    from onetrainer.config.io import load_preset
    from onetrainer.training.checks import check_sharded

    config, problems = load_preset("flux2/finetune-48gb-dev")
    assert not [p for p in problems if p.is_error]
    assert not fit_to_budget(config.copy(), 24 * GIB).fits
    fit = fit_to_budget(config.copy(), 24 * GIB, gpus=4)
    changed = {c.path: c for c in fit.changes}
    assert fit.fits and fit.estimate.mode == "sharded" and fit.estimate.peak_bytes <= 24 * GIB
    assert changed["optimizer.fused_back_pass"].after is False
    assert changed["transformer.offload_fraction"].after == 0.0
    assert changed["transformer.weight_dtype"].after is DataType.FLOAT_32
    assert "stochastic rounding" in changed["transformer.weight_dtype"].why
    assert changed["multi_gpu_mode"].after is MultiGpuMode.SHARDED
    applied = config.copy()
    apply(applied, fit.changes)
    assert not [p for p in check_sharded(applied) if p.is_error]
    assert estimate(applied, device="cuda").peak_bytes == pytest.approx(fit.estimate.peak_bytes)


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


def _flux_big_lora():
    """A rank-64 Flux LoRA at 512 px: about 12 GiB on one GPU after the cheap steps, which 12 GiB holds only with
    more than half of the blocks offloaded."""
    config, _ = config_from_dict({
        "model_type": "FLUX_DEV_1", "training_method": "LORA", "output_model_format": "KOHYA_LORA", "lora_rank": 64,
        "base_model_name": "black-forest-labs/FLUX.1-dev", "resolution": "512", "batch_size": 1,
        "train_dtype": "BFLOAT_16", "latent_caching": True, "optimizer": {"optimizer": "ADAMW"},
        "transformer": {"weight_dtype": "BFLOAT_16"},
        "text_encoder": {"train": False, "weight_dtype": "BFLOAT_16"},
        "text_encoder_2": {"train": False, "weight_dtype": "BFLOAT_16"},
    })  # fmt: skip
    return config


def test_a_big_flux_lora_is_split_over_two_12_gib_gpus_rather_than_mostly_offloaded():
    """One 12 GiB GPU: FLOAT_8 weights and more than half of the blocks offloaded; two: the same cheap steps, then the
    denoiser split over both instead of the offloading, a change the estimate of the applied config agrees with."""
    config = _flux_big_lora()
    alone = fit_to_budget(config, 12 * GIB)
    one = {c.path: c.after for c in alone.changes}
    assert alone.fits and one["transformer.offload_fraction"] > 0.5 and "multi_gpu_mode" not in one

    two = fit_to_budget(config, 12 * GIB, gpus=2)
    changed = {c.path: c.after for c in two.changes}
    assert two.fits and changed["multi_gpu_mode"] is MultiGpuMode.MODEL_SPLIT and changed["multi_gpu"] is True
    assert changed["split_devices"] == "cuda:0,cuda:1" and "transformer.offload_fraction" not in changed
    assert changed["transformer.weight_dtype"] is DataType.FLOAT_8  # the one-GPU steps before it still come first
    assert two.estimate.mode == "model split" and list(two.estimate.devices) == ["cuda:0", "cuda:1"]
    assert max(two.estimate.devices.values()) <= 12 * GIB < two.estimate.modes["data parallel"]
    assert "spread over 2 GPUs" in two.text()
    applied = config.copy()
    apply(applied, two.changes)
    assert estimate(applied, device="cuda", device_memory=12 * GIB).peak_bytes == pytest.approx(two.estimate.peak_bytes)


def _split_estimate(config) -> Estimate:
    """`_fake_estimate`, with a split over several GPUs saving 9 GiB."""
    result = _fake_estimate(config)
    if config.multi_gpu and config.multi_gpu_mode is MultiGpuMode.MODEL_SPLIT:
        result.peak_bytes -= 9 * GIB
    return result


@pytest.mark.parametrize(
    ("budget", "gpus", "split"),
    [(9.0, 2, False), (5.0, 2, True), (5.0, 1, False), (1.0, 2, True)],
)  # fmt: skip
def test_the_split_replaces_offloading_of_more_than_half_the_blocks(budget, gpus, split):
    """Before offloading (batch 1): 20 - 2 - 3 - 4 - 0.5 - 1 = 9.5 GiB. At 9 GiB, 0.1 of the blocks offloaded fits
    one GPU: no split; at 5 GiB one GPU needs 0.6: split over two (0.5 GiB), offloaded on one; at 1 GiB no fraction
    fits one GPU: split."""
    config, _ = config_from_dict({
        "model_type": "FLUX_DEV_1", "training_method": "LORA", "output_model_format": "KOHYA_LORA",
        "latent_caching": True, "transformer": {"gradient_checkpointing": False, "weight_dtype": "BFLOAT_16"},
        "text_encoder": {"train": False, "weight_dtype": "FLOAT_8"}, "text_encoder_2": {"train": False},
    })  # fmt: skip
    fit = fit_to_budget(config, budget * GIB, estimate_of=_split_estimate, gpus=gpus)
    changed = {c.path: c.after for c in fit.changes}
    assert fit.fits
    assert (changed.get("multi_gpu_mode") is MultiGpuMode.MODEL_SPLIT) is split
    assert ("transformer.offload_fraction" in changed) is not split


def test_the_split_is_not_chosen_for_a_fine_tune_beside_data_parallel_or_what_it_does_not_combine_with():
    config, _ = config_from_dict({
        "model_type": "FLUX_DEV_1", "training_method": "LORA", "output_model_format": "KOHYA_LORA",
        "latent_caching": True, "transformer": {"gradient_checkpointing": False, "weight_dtype": "BFLOAT_16"},
        "text_encoder": {"train": False, "weight_dtype": "FLOAT_8"}, "text_encoder_2": {"train": False},
    })  # fmt: skip

    def split_chosen(trial) -> bool:
        fit = fit_to_budget(trial, 5 * GIB, estimate_of=_split_estimate, gpus=2)
        return any(c.path == "multi_gpu_mode" and c.after is MultiGpuMode.MODEL_SPLIT for c in fit.changes)

    assert split_chosen(config)
    fine_tune = config.copy()
    fine_tune.training_method = fine_tune.training_method.__class__("FINE_TUNE")
    assert not split_chosen(fine_tune)
    compiled = config.copy()
    compiled.compile = True  # check_model_split refuses compile
    assert not split_chosen(compiled)
    # already data parallel over 2 GPUs: each still trains its share of the batch with 0.6 of its blocks offloaded
    parallel = config.copy()
    parallel.multi_gpu, parallel.device_indexes = True, "0,1"
    assert not split_chosen(parallel)
    # ... but where no fraction fits one GPU, the split is the way
    assert any(
        c.after is MultiGpuMode.MODEL_SPLIT
        for c in fit_to_budget(parallel, 1 * GIB, estimate_of=_split_estimate, gpus=2).changes
    )


def _ram_estimate(config) -> Estimate:
    """`_fake_estimate` with host RAM: 10 GiB, and 20 GiB more once layer offloading keeps the blocks in RAM."""
    result = _fake_estimate(config)
    result.host_bytes = (10.0 + (20.0 if config.transformer.offload_fraction > 0 else 0.0)) * GIB
    result.host_training = result.host_bytes
    return result


def test_a_ram_budget_leaves_out_the_offloading_the_host_cannot_hold():
    config, _ = config_from_dict({
        "model_type": "FLUX_DEV_1", "training_method": "LORA", "output_model_format": "KOHYA_LORA",
        "latent_caching": True, "transformer": {"gradient_checkpointing": False, "weight_dtype": "BFLOAT_16"},
        "text_encoder": {"train": False, "weight_dtype": "FLOAT_8"}, "text_encoder_2": {"train": False},
    })  # fmt: skip
    roomy = fit_to_budget(config, 8 * GIB, estimate_of=_ram_estimate, ram_budget_bytes=64 * GIB)
    assert roomy.fits and "transformer.offload_fraction" in {c.path for c in roomy.changes}

    tight = fit_to_budget(config, 8 * GIB, estimate_of=_ram_estimate, ram_budget_bytes=16 * GIB)
    paths = {c.path for c in tight.changes}
    assert "transformer.offload_fraction" not in paths and "transformer.activation_offloading" in paths
    assert not tight.fits and tight.fits_ram and tight.estimate.host_bytes == 10 * GIB
    assert tight.left_out and tight.left_out[0].startswith("transformer.offload_fraction")
    assert tight.headline.startswith("cannot fit 8.0 GiB VRAM and 16.0 GiB RAM: ≈ 9.5 GiB VRAM, 10.0 GiB RAM")
    assert "left out for the RAM budget: transformer.offload_fraction" in tight.text()


def test_the_fit_rounds_as_the_estimate_beside_start():
    small = Estimate(631 * MIB, None, {}, device="cuda", host_bytes=3 * GIB)
    fit = fit_to_budget(config_from_dict({})[0], 8 * GIB, estimate_of=lambda _config: small)
    assert fit.headline == "fits 8.0 GiB VRAM as it is (≈ 631 MiB VRAM, 3.0 GiB RAM)"
    assert small.summary().startswith("≈ 631 MiB VRAM · 3.0 GiB RAM")  # the same figures beside Start


def test_a_run_over_its_budgets_with_nothing_left_to_change_says_which_and_why():
    large = Estimate(
        6 * GIB, None, {}, device="cuda", host_bytes=34 * GIB, host_loading=32 * GIB, host_training=9 * GIB
    )
    config, _ = config_from_dict({})
    fit = fit_to_budget(config, 8 * GIB, estimate_of=lambda _config: large, ram_budget_bytes=32 * GIB)
    assert not fit.fits and not fit.changes
    assert fit.headline.startswith("cannot fit 8.0 GiB VRAM and 32.0 GiB RAM: ≈ 6.0 GiB VRAM, 34.0 GiB RAM and nothing")
    assert "loading alone holds 32.0 GiB in RAM" in fit.headline  # where the RAM goes


def test_train_py_fits_the_run_prints_each_change_and_exits_unless_asked_to_train(tmp_path, capsys, monkeypatch):
    from onetrainer.cli import train as cli_train
    from onetrainer.cli.train import EXIT_INVALID, EXIT_OK, main
    from onetrainer.training import runner
    from onetrainer.training.events import Finished
    from tests.helpers import image_folder

    trained = []

    def run_training(config, *_args, **_kwargs):
        trained.append(config)
        return Finished("completed", "", 1)

    monkeypatch.setattr(runner, "run_training", run_training)
    monkeypatch.chdir(tmp_path)
    # The demo passes every check: a fit alone used to go on and train it, writing models/ and workspace/ here.
    assert main(["--preset", "demo", "--fit-vram", "8"]) == EXIT_OK
    assert "--fit-vram 8: fits 8.0 GiB VRAM as it is" in capsys.readouterr().out
    assert trained == [] and list(tmp_path.iterdir()) == []

    folder = image_folder(tmp_path, count=2)
    sets = [
        "base_model_name=black-forest-labs/FLUX.1-dev",
        "offline_mode=true",
        "concepts=" + json.dumps([{"name": "a", "path": str(folder)}]),
    ]
    argv = ["--preset", "flux/lora-24gb", *(a for s in sets for a in ("--set", s))]
    assert main([*argv, "--fit-vram", "9"]) == EXIT_OK
    out = capsys.readouterr().out
    assert "--fit-vram 9: fitted to 9.0 GiB VRAM" in out and "transformer.offload_fraction" in out
    assert "the same as: --set optimizer.optimizer=ADAMW_8BIT" in out and "Not trained: add --train" in out
    assert trained == [] and sorted(p.name for p in tmp_path.iterdir()) == ["images"]  # nothing trained, written

    with monkeypatch.context() as checks:  # the hub model is not cached here: the checks would refuse to train
        checks.setattr(cli_train, "run_checks", lambda *_args, **_kwargs: [])
        assert main([*argv, "--fit-vram", "9", "--train"]) == EXIT_OK
    assert len(trained) == 1 and 0 < trained[0].transformer.offload_fraction <= 0.9  # trained as fitted

    code = main([*argv, "--fit-vram", "9", "--check"])
    assert code in (EXIT_OK, EXIT_INVALID)  # the hub model is not cached here (offline): --check may refuse that
    assert main([*argv, "--fit-vram", "0.5", "--check"]) == EXIT_INVALID
    assert "cannot fit 512 MiB VRAM" in capsys.readouterr().out
    # Loading reads the transformer into RAM (22 GiB in bfloat16) whatever the settings: no change fits 16 GiB of RAM.
    assert main([*argv, "--fit-vram", "9", "--fit-ram", "16"]) == EXIT_INVALID
    assert "loading alone holds" in capsys.readouterr().out
    assert main([*argv, "--fit-vram", "9", "--train", "--check"]) == EXIT_INVALID
    assert len(trained) == 1
    config, _ = load_layers("flux/lora-24gb", None, [])
    assert config.transformer.offload_fraction == 0  # the preset file is never changed


def test_the_ram_budget_holds_a_sharded_runs_processes_together():
    """--fit-ram is the machine's host RAM: a sharded run's processes together count against it, not one process's
    peak (each holds little, all of them together one whole model at load)."""
    sharded = Estimate(10 * GIB, None, {}, device="cuda")
    sharded.host_bytes, sharded.host_all_bytes, sharded.processes = 30 * GIB, 70 * GIB, 4
    assert Fit(None, estimate=sharded, ram_budget=64 * GIB).fits is False
    assert Fit(None, estimate=sharded, ram_budget=80 * GIB).fits is True
    alone = Estimate(10 * GIB, None, {}, device="cuda")
    alone.host_bytes = 30 * GIB
    assert alone.machine_host_bytes == 30 * GIB and Fit(None, estimate=alone, ram_budget=32 * GIB).fits
