"""The estimate's arithmetic on known counts, the full-size counts it builds, and its advice."""

from __future__ import annotations

import pytest

from onetrainer.config import config_from_dict
from onetrainer.config.enums import DataType
from onetrainer.training.estimate import (
    FAMILY_CONSTANTS,
    GIB,
    OVERHEAD,
    PartCount,
    Settings,
    estimate,
    estimate_from_counts,
    model_shapes,
)

SD = Settings("sd", batch_size=1, resolution=512, gradient_checkpointing=False, train_dtype_bytes=2.0,
              trained_dtype_bytes=4.0, optimizer_state_bytes=8.0)  # fmt: skip


def test_arithmetic_on_known_counts():
    counts = {
        "unet": PartCount(1_000_000_000, DataType.FLOAT_16, trained=10_000_000),
        "text_encoder": PartCount(100_000_000, DataType.FLOAT_32, on_device=False),
    }
    result = estimate_from_counts(counts, SD, flops_per_second=1e12)
    assert result.parts["weights"] == 2e9  # the text encoder is not on the device
    assert result.parts["training state"] == 10_000_000 * (4 + 4 + 8)  # weights, gradients, two Adam moments
    assert result.parts["activations"] == FAMILY_CONSTANTS["sd"]["activations"]
    assert result.peak_bytes == pytest.approx(2e9 + 1.6e8 + FAMILY_CONSTANTS["sd"]["activations"] + OVERHEAD)
    assert result.step_seconds == pytest.approx(3 * FAMILY_CONSTANTS["sd"]["flops"] / 1e12)

    bigger = Settings(**{**SD.__dict__, "batch_size": 2, "resolution": 1024, "gradient_checkpointing": True})
    scaled = estimate_from_counts(counts, bigger, flops_per_second=1e12)
    assert scaled.parts["activations"] == pytest.approx(FAMILY_CONSTANTS["sd"]["checkpointed"] * 2 * 4)
    assert scaled.step_seconds == pytest.approx(4 * FAMILY_CONSTANTS["sd"]["flops"] * 2 * 4 / 1e12)

    fp8 = {**counts, "unet": PartCount(1_000_000_000, DataType.FLOAT_8, trained=10_000_000)}
    assert estimate_from_counts(fp8, SD).parts["weights"] == 1e9  # fp8 cuts 16-bit weights in half


def test_full_size_counts_match_the_released_models():
    shapes = model_shapes("STABLE_DIFFUSION_15")
    assert shapes["unet"]["params"] == 859_520_964
    assert shapes["text_encoder"]["params"] == 123_060_480
    assert shapes["vae"]["params"] == 83_653_863


def test_advice_names_settings_that_bring_it_under():
    config, _ = config_from_dict({
        "model_type": "STABLE_DIFFUSION_XL_10_BASE", "training_method": "LORA", "output_model_format": "KOHYA_LORA",
        "resolution": "1024", "batch_size": 4, "unet": {"gradient_checkpointing": False},
    })  # fmt: skip
    result = estimate(config, free_bytes=12 * GIB)
    assert result.fits is False
    assert result.advice and any("gradient checkpointing" in a for a in result.advice)
    assert "does not fit" in result.text()
    roomy = estimate(config, free_bytes=1000 * GIB)
    assert roomy.fits and roomy.advice == []


def test_preflight_prints_the_estimate(tmp_path, capsys):
    from onetrainer.cli.train import main
    from tests.helpers import image_folder, tiny_config, write_config

    image_folder(tmp_path)
    config = tiny_config(tmp_path, resolution="512")
    assert main(["--config-path", str(write_config(tmp_path, config)), "--preflight"]) == 0
    out = capsys.readouterr().out
    assert "estimate: estimated peak VRAM" in out and "s/step" in out and "activations" in out
