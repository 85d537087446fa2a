"""`compile`: the denoiser's blocks compiled with torch.compile, one block at a time ("regional" compilation).

Each block's `forward` is compiled on its own, so the blocks of one kind share one compiled graph (the first call
compiles it, the others reuse it after a guard check) and the start-up cost is a few graphs, not the whole model's.
Hooks on a block (layer offloading) and gradient checkpointing (which calls the block) stay outside the compiled
code: they work as without compiling. Where the platform cannot compile (no Triton for a CUDA device, no C++
compiler for a CPU), the run says so and trains uncompiled.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Sequence

import torch

BACKEND = "inductor"


def unavailable_reason(device: torch.device | str) -> str | None:
    """Why torch.compile's default backend cannot compile for `device` here; None when it can."""
    device = torch.device(device)
    if device.type == "cuda":
        from torch.utils._triton import has_triton

        if not has_triton():
            return "compiling for a CUDA GPU needs Triton (on Windows triton-windows), which is not installed"
        return None
    if device.type == "cpu":
        compilers = [os.environ.get("CXX", ""), "cl"] if sys.platform == "win32" else [os.environ.get("CXX", ""), "g++"]
        if not any(name and shutil.which(name) for name in compilers):
            return "compiling for the CPU needs a C++ compiler (g++; on Windows MSVC's build tools), not found here"
        return None
    return f"compiling for {device.type} is not supported by torch.compile's default backend"


def compile_blocks(module: torch.nn.Module, block_paths: Sequence[str], backend: str | None = None) -> int:
    """Compile the `forward` of each block of `module` under `block_paths` (ModuleLists) with `backend` (default
    `BACKEND`); returns how many."""
    backend = backend or BACKEND
    count = 0
    for path in block_paths:
        for block in module.get_submodule(path):
            if getattr(block.forward, "_onetrainer_compiled", False):
                continue
            compiled = torch.compile(block.forward, backend=backend)
            compiled._onetrainer_compiled = True  # type: ignore[attr-defined]
            block.forward = compiled
            count += 1
    return count
