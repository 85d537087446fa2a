"""Keep bitsandbytes from asking the Hugging Face hub for a kernel when it is imported.

On a CPU with AVX512-BF16, bitsandbytes' CPU backend calls `kernels.get_kernel("kernels-community/quantization-
bitsandbytes")` at import (and diffusers and transformers import bitsandbytes on any model import). Online, that is a
publisher check and a download from the hub at every start, offline settings or not; with HF_HUB_OFFLINE set, a
"Skipping publisher trust check" notice in every log and `--preflight`; with the hub unreachable, a connection attempt
(and its retries on a slow network). The kernel only speeds up 4-bit matmuls on the CPU, which OneTrainer never runs
(NFLOAT_4 needs CUDA), so while that one module runs, `kernels` cannot be imported: bitsandbytes then uses its own code
and logs a notice that `quiet.py` filters. No torch is imported here.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from types import ModuleType

BITSANDBYTES_CPU_BACKEND = "bitsandbytes.backends.cpu.ops"
_ABSENT = object()


class _WithoutKernels(importlib.abc.Loader):
    """The module's own loader, run with `kernels` unimportable (`sys.modules["kernels"] = None`), then restored."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        saved = sys.modules.get("kernels", _ABSENT)
        sys.modules["kernels"] = None  # type: ignore[assignment]  (an import of it raises ImportError)
        try:
            self._loader.exec_module(module)
        finally:
            if saved is _ABSENT:
                sys.modules.pop("kernels", None)
            else:
                sys.modules["kernels"] = saved  # type: ignore[assignment]

    def __getattr__(self, name: str):  # get_source and the like, for tracebacks and inspect
        return getattr(self._loader, name)


class _BitsandbytesCpuBackendFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path, target=None) -> importlib.machinery.ModuleSpec | None:
        if fullname != BITSANDBYTES_CPU_BACKEND:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _WithoutKernels(spec.loader)
                return spec
        return None


def keep_bitsandbytes_off_the_hub() -> None:
    """Install the import hook (once; before anything imports bitsandbytes)."""
    if not any(isinstance(f, _BitsandbytesCpuBackendFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _BitsandbytesCpuBackendFinder())
