"""The training device and mixed precision."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable

import torch

from onetrainer.config.enums import DataType
from onetrainer.precision.dtypes import torch_dtype


def training_threads() -> int:
    """The torch CPU threads a run uses: all cores but one. The TensorBoard server, data loading, the GUI and the rest
    of the machine keep a core; with every core busy, OpenMP's waiting threads spin against them and steps slow down.
    """
    return max(1, (os.cpu_count() or 1) - 1)


@contextlib.contextmanager
def torch_threads(count: int):
    """Run with `count` torch CPU threads, then restore the previous count."""
    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def seed_step_generators(seed: int, device: torch.device) -> None:
    """Seed the global generators a training step on `device` draws from (adapter dropout and the like): the CPU's,
    and the device's own when it is an accelerator.

    This is what `torch.manual_seed` does for those generators, without its cost per step: it also seeds every other
    backend torch was built with (CUDA, XPU, MTIA), and for each one not initialised, as on a CPU-only machine, it
    formats a stack trace to queue the seed (about 0.4 ms a call on a 2-core CPU).
    """
    torch.default_generator.manual_seed(seed)
    if device.type == "cuda":
        if torch.cuda.is_initialized():
            index = device.index if device.index is not None else torch.cuda.current_device()
            torch.cuda.default_generators[index].manual_seed(seed)
        else:  # nothing is on the device yet: seeded when CUDA starts, as torch.manual_seed does
            torch.cuda.manual_seed_all(seed)
    elif device.type != "cpu":
        torch.manual_seed(seed)  # another accelerator (MPS, XPU): its generator is seeded the usual way


def select_device(name: str, warn: Callable[[str], None]) -> torch.device:
    """The configured device; without CUDA (or MPS) the CPU, with a warning that says so."""
    device = torch.device(name.strip() or "cpu")
    if device.type == "cuda" and not torch.cuda.is_available():
        warn(f"no CUDA device: training on the CPU, much slower (train device '{name}')")
        return torch.device("cpu")
    if device.type == "mps" and not torch.backends.mps.is_available():
        warn(f"device '{name}': MPS is not available; using the CPU")
        return torch.device("cpu")
    if device.type == "cuda":
        # Attention through flash or memory-efficient SDPA, never cuDNN's: on an H200 with torch 2.11 (cuDNN 9.19)
        # cuDNN's SDPA backward fails at a 4608-token joint attention (a 1024 px image's tokens and 512 text tokens)
        # with an illegal memory access (docs/benchmarks.md, the full-size transformer entry), and the other two
        # kernels are as fast for training. Process-wide, as a run is.
        torch.backends.cuda.enable_cudnn_sdp(False)
    return device


def release_cached_memory(device: torch.device) -> None:
    """Give the memory a failed step or sample left in torch's CUDA cache back, so the run goes on with room."""
    if device.type == "cuda":
        torch.cuda.empty_cache()


def autocast(device: torch.device, train_dtype: DataType):
    """Mixed precision for the forward pass; FLOAT_32 (and TFLOAT_32) run without autocast."""
    if train_dtype in (DataType.FLOAT_32, DataType.TFLOAT_32):
        if train_dtype is DataType.TFLOAT_32 and device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch_dtype(train_dtype))


class _NoScaler:
    """The grad-scaler interface for training without FLOAT_16: every call passes through."""

    def scale(self, loss):
        return loss

    def unscale_(self, optimizer) -> None:
        pass

    def step(self, optimizer) -> None:
        optimizer.step()

    def update(self) -> None:
        pass


def grad_scaler(device: torch.device, train_dtype: DataType, param_groups: list[dict] = ()):
    """FLOAT_16 training on CUDA scales the loss so small gradients do not underflow to zero. Not when a trained
    weight is bfloat16 (a fine-tuned BFLOAT_16 prior): torch's scaler cannot unscale bfloat16 gradients, and a part
    stored in bfloat16 computes in it (`util/part_dtypes`), whose range needs no scaling."""
    trains_bf16 = any(p.dtype == torch.bfloat16 for group in param_groups for p in group["params"])
    if train_dtype is DataType.FLOAT_16 and device.type == "cuda" and not trains_bf16:
        return torch.amp.GradScaler("cuda")
    return _NoScaler()
