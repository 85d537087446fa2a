"""Notices known to be harmless (bitsandbytes' missing `kernels`, transformers' torchvision fallback, diffusers'
empty float32 list) are not shown; everything else those loggers log still is."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest
import torch

import onetrainer  # noqa: F401  (installs the filter, as any use of the package does)
from tests.conftest import ROOT


def test_only_the_missing_kernels_notice_is_filtered(caplog):
    logger = logging.getLogger("bitsandbytes.backends.cpu.ops")
    with caplog.at_level(logging.WARNING, logger="bitsandbytes.backends.cpu.ops"):
        logger.warning(
            "Failed to load CPU gemm_4bit_forward from kernels-community: %s. Please make sure you already "
            "`pip install kernels` and the kernels >= 0.11.1",
            ModuleNotFoundError("No module named 'kernels'"),
        )
        logger.warning("another bitsandbytes warning")
    assert [r.getMessage() for r in caplog.records] == ["another bitsandbytes warning"]


@pytest.mark.slow
def test_preflight_output_has_no_bitsandbytes_kernels_notice(tmp_path):
    """A real process, where bitsandbytes is first imported (through diffusers) during the estimate; offline, as for a
    user without a network (there kernels said it skipped the publisher check of bitsandbytes' CPU kernel)."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "train.py"), "--preflight", "--preset", "demo"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert result.returncode == 0, result.stderr
    assert "estimate:" in result.stdout
    assert "kernels" not in result.stdout + result.stderr
    assert "gemm_4bit" not in result.stdout + result.stderr


@pytest.mark.parametrize(
    ("logger_name", "harmless", "other"),
    [
        (
            "transformers.utils.import_utils",
            "`CLIPImageProcessor` requires torchvision (not installed); falling back to `CLIPImageProcessorPil` for "
            "backward compatibility. Install torchvision to use the default backend, or import "
            "`CLIPImageProcessorPil` directly to silence this warning.",
            "`Foo` requires torchvision >= 0.27",
        ),
        (
            "diffusers.models.modeling_utils",
            "There are modules in UNet2DConditionModel that should be kept in float32: []. Casting directly with "
            "`to()` can lead to inconsistent results; set `torch_dtype` in `from_pretrained()` instead to keep these "
            "modules in float32.",
            "There are modules in T5EncoderModel that should be kept in float32: ['wo']. Casting directly …",
        ),
    ],
)
def test_library_notices_of_nothing_wrong_are_filtered(logger_name, harmless, other):
    logger = logging.getLogger(logger_name)
    heard = _Recorder()
    logger.addHandler(heard)  # the libraries' own loggers do not propagate to the root: listen on the logger itself
    # The filter is under test, not the level: `quiet_libraries` (run by earlier tests in this process, as by the app's
    # training) raises the libraries' levels to errors, which would drop both records before any filter sees them.
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        logger.warning(harmless)
        logger.warning(other)
    finally:
        logger.setLevel(level)
        logger.removeHandler(heard)
    assert heard.messages == [other]


def test_diffusers_cast_of_a_model_keeping_nothing_in_float32_is_quiet():
    """The real warning: diffusers' `to(dtype)` of a model with no float32 layers."""
    from diffusers import AutoencoderKL

    vae = AutoencoderKL(block_out_channels=(8,), norm_num_groups=8, latent_channels=4, layers_per_block=1)
    logger = logging.getLogger("diffusers.models.modeling_utils")
    level = logger.level
    heard = _Recorder()
    logger.addHandler(heard)
    logger.setLevel(logging.WARNING)  # as in a process where nothing made diffusers quiet (the suite's runs do)
    try:
        vae.to(torch.float32)
        vae._keep_in_fp32_modules = ["encoder"]
        vae.to(torch.float32)
    finally:
        logger.removeHandler(heard)
        logger.setLevel(level)
    assert len(heard.messages) == 1 and "should be kept in float32: ['encoder']" in heard.messages[0]


class _Recorder(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())
