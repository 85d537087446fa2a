"""Importing bitsandbytes (as diffusers does on any model import) asks the hub for nothing and prints nothing about
kernels, whatever the CPU: its AVX512-BF16 branch, which asks the hub for a CPU kernel, is taken on every machine."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.helpers import CountingHub

IMPORT_BITSANDBYTES = """
import logging, sys
logging.basicConfig(level=logging.INFO, stream=sys.stdout)
import onetrainer

asked = []

class TakeTheBf16Branch:
    # Once bitsandbytes.functional is imported, just before the CPU backend: claim the CPU has AVX512-BF16.
    def find_spec(self, name, path, target=None):
        if name == "bitsandbytes.backends.cpu.ops":
            sys.modules["bitsandbytes.functional"].has_avx512bf16 = lambda: asked.append(1) or True
        return None

sys.meta_path.insert(0, TakeTheBf16Branch())
import bitsandbytes
print("branch taken:", bool(asked), "| kernels imported:", "kernels" in sys.modules)
import kernels  # only that module's run was kept from it: transformers' own uses of kernels still import it
print("kernels importable:", hasattr(kernels, "get_kernel"))
"""


@pytest.mark.slow
def test_importing_bitsandbytes_asks_the_hub_nothing(tmp_path):
    hub = CountingHub()
    environment = {
        **{k: v for k, v in os.environ.items() if not k.startswith("HF_")},  # online, as a user with a network
        "HF_ENDPOINT": hub.url,
        "HF_HOME": str(tmp_path / "hf-home"),
    }
    try:
        result = subprocess.run(
            [sys.executable, "-c", IMPORT_BITSANDBYTES], capture_output=True, text=True, env=environment, cwd=ROOT
        )
    finally:
        asked = hub.close()
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "branch taken: True | kernels imported: False" in result.stdout, output
    assert "kernels importable: True" in result.stdout, output
    assert asked == [], output
    assert "kernels-community" not in output and "gemm_4bit" not in output, output
