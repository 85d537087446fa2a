"""The harmless bitsandbytes notice about a missing `kernels` package is not shown; everything else still is."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest

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
