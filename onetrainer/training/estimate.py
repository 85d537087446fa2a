"""An estimate of peak memory and time per step before Start, from the model to be trained and the settings.

Memory = the parts' weights (each part's parameter count × the bytes of its configured weight dtype; a part that is
not needed on the device while stepping — a text encoder whose outputs are cached, an image encoder with cached
latents, a part used only for samples, as the family's `part_roles` say — is left out) + the trained parameters,
their gradients and the optimizer's state + the activations the backward pass keeps + on CUDA a fixed overhead (the
CUDA context, allocator slack). A fine-tune trains the parts' own weights in their dtype: only their gradients and the
optimizer's state add to the weights. The peak is the larger of that step and the time every part is on the device
together (`resident`: the model's load, filling the caches, rendering a sample: all weights, the trained parameters and
the optimizer's state, no training activations) — where a text encoder is large and its outputs are cached, that
time is the peak. With the denoiser's blocks offloaded, its weights and the activations are taken where in the passes
their sum is largest (`_offloaded_step`), not each at its own largest. Time = the denoiser's training FLOPs per
step (forward + backward = 3 forwards, 4 with checkpointing's recomputation) over the device's measured matmul
throughput. Host RAM (`_add_host`) = the process itself + the larger of the load (at its largest: the part being read,
in the dtype it is read in, beside the parts read before it as they are kept) and what training keeps on the host
(parts off the device, offloaded blocks and their state, offloaded activations, a CPU EMA, the caches' entries in
memory).

Nothing here knows a family. The parameter counts come from the model that will be trained (`model_shapes`): the
safetensors headers of a local diffusers folder, of a built model, or of a hub model in the local cache (no
weights are read); a hub model not downloaded yet, a single file, a backup are counted as the released model of
their type, built on the meta device from `families/meta_models.py` (no memory, no download). The activations and
FLOPs are measured (`measure_activations`): the model is built on the meta device from its parts' configs, and the
family's own training step — `encode_images` on a batch of the run's resolution, `encode_text`, `batch_extras`,
`predict`, as the trainer calls them — runs there on shapes alone, while the tensors autograd saves for the backward
pass are added up (and, with gradient checkpointing, what checkpointing keeps). Where the family's step cannot run on
the meta device, a per-parameter rule stands in and the estimate says so. Where training runs on the CPU (no CUDA
device), the estimate is of RAM and says so.

The arithmetic (`estimate_from_counts`) takes plain numbers so it is tested on known counts.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from onetrainer.config.enums import GGUF_WEIGHT_DTYPES, QUANTIZED_WEIGHT_DTYPES, DataType, TrainingMethod
from onetrainer.config.optimizer_memory import optimizer_state_bytes

if TYPE_CHECKING:
    import torch

    from onetrainer.config import TrainConfig
    from onetrainer.families.base import Family, LoadedModel

GIB = 1024**3
BYTES = {
    DataType.FLOAT_32: 4.0,
    DataType.TFLOAT_32: 4.0,
    DataType.FLOAT_16: 2.0,
    DataType.BFLOAT_16: 2.0,
    DataType.FLOAT_8: 1.0,
    DataType.INT_8: 1.0,  # and a float32 scale per output channel: next to nothing
    DataType.INT_W8A8: 1.0,
    DataType.FLOAT_W8A8: 1.0,
    # compressed: at most the 8-bit size (how far the weights compress is known once they are)
    DataType.INT_W8A8_COMPRESSED: 1.0,
    DataType.FLOAT_W8A8_COMPRESSED: 1.0,
    DataType.NFLOAT_4: 0.5625,  # 4 bits plus a scale per 64 weights
    # A .gguf file's blocks: Q8_0's 8.5 bits until the file says (`PartCount.quantized_bytes`)
    DataType.GGUF: 1.0625,
    DataType.GGUF_A8_INT: 1.0625,
    DataType.GGUF_A8_FLOAT: 1.0625,
}
OVERHEAD = 0.6 * GIB  # CUDA only: the context and the allocator's slack
MIB = 1024**2
# Host RAM (`Estimate.host_bytes`). The process itself: Python with torch, diffusers, transformers and peft imported
# (0.4 GiB measured on a CPU machine, rounded up for the data loader and the window); on CUDA the runtime's context and
# kernel libraries in host memory besides: an allowance until a GPU measurement replaces it.
HOST_PROCESS = 0.5 * GIB
HOST_CUDA_RUNTIME = 1.5 * GIB
# The activations measured on the meta device are the tensors autograd keeps; a real step holds more at its peak: the
# gradients flowing back through the largest block, the block being recomputed under checkpointing, the allocator's
# rounding. One factor for every family, set from the two GPU measurements in docs/benchmarks.md (the 512 px and 1024 px
# UNet LoRA runs, checkpointing on, H200): the tensors measured here come to 0.21 and 0.68 GiB, while the measured peaks
# less the weights and the training state leave 0.30 and 0.71 GiB; × 1.5 keeps both just on the safe side.
PEAK_FACTOR = 1.5


class EstimateCancelled(Exception):
    """The caller no longer wants this estimate (the window's config changed again, or a run starts)."""


# The running estimate's "stop now?" question: asked between parts and before every module of the measured forward, so
# that a cancelled estimate lets go of the model library within milliseconds rather than after its full measurement.
_CANCELLED: contextvars.ContextVar[Callable[[], bool] | None] = contextvars.ContextVar("estimate_cancel", default=None)


def _stop_if_cancelled(*_args: Any) -> None:
    cancelled = _CANCELLED.get()
    if cancelled is not None and cancelled():
        raise EstimateCancelled


# The per-parameter rule where a family's step cannot run on the meta device, from the measured SD 1.5 UNet (no
# checkpointing, 512 px): bytes kept per sample in 16-bit per image pixel per square root of the denoiser's
# parameters (activations grow with its width), the share checkpointing keeps, forward FLOPs per parameter per pixel.
RULE_ACTIVATIONS = 0.122
RULE_CHECKPOINTED = 0.25
RULE_FLOPS = 0.0036
OFFLOAD_ADVICE = 0.5  # the layer offload fraction the advice tries
# Bytes per element of the weight the fused back pass steps: the optimizer's float32 temporaries (an update, a
# denominator, the weight in float32): 0.6 GiB for a 12 B transformer's largest weight on an H200 (docs/benchmarks.md).
FUSED_STEP_WORK = 12.0


@dataclass(frozen=True)
class PartCount:
    params: int
    dtype: DataType
    on_device: bool = True  # needed on the GPU during training steps
    trained: int = 0  # trained parameters of (or adapters on) this part
    text_encoder: bool = False  # the family declares it a text encoder (the advice may cache its outputs)
    # A quantized part (FLOAT_8, NFLOAT_4) quantizes only its Linear and Conv2d weights (`precision/quantize`): the
    # rest — norms, embeddings, biases, the layers its class keeps out of low precision (`_keep_in_fp32_modules`) —
    # stays in the training dtype, `plain_bytes` each.
    plain: int = 0
    plain_bytes: float = 2.0
    # Frozen block parameters layer offloading keeps in CPU memory at any time (`offload_fraction` of the blocks).
    offloaded: int = 0
    # Bytes per quantized weight where the file tells (a GGUF file's mix of Q8_0, Q5_K, …); else BYTES[dtype].
    quantized_bytes: float | None = None
    # Of `offloaded`, the trained parameters (a fine-tune with the fused back pass): their optimizer state is off the
    # device with them.
    trained_offloaded: int = 0
    # Layer offloading's blocks in execution order, each with the parameters that move with it, and how many blocks the
    # device holds at a time (`memory/layer_offload.py`'s window): where in the passes the weights are largest.
    offload_blocks: tuple[tuple[str, int], ...] = ()
    window: int = 0
    # The largest trained tensor (a fine-tune): the fused back pass holds its gradient and the optimizer's working
    # copies while it steps it.
    largest_trained: int = 0
    # Bytes per parameter while the part is read (`families/loading.load_data_type`'s, or more where its library reads
    # it as its files store it); None: its weight dtype's.
    load_bytes: float | None = None
    # Trained parameters whose optimizer state waits in page-locked CPU memory with their offloaded blocks, in float32
    # elements as torch's pinned allocator takes them (each tensor rounded up to a power of two bytes).
    trained_pinned: float = 0.0
    # The parameters of the part's largest declared block (`Family.layer_blocks`; 0: none declared), the unit a
    # sharded run gathers at a time (`_sharded`).
    largest_block: int = 0
    # The part's declared blocks in execution order, each as (its name in the part, its parameters, the adapter
    # parameters inside it): what a model split (`_split`) spreads over its devices. Only a LoRA's denoiser.
    split_blocks: tuple[tuple[str, int, int], ...] = ()

    @property
    def bytes(self) -> float:
        """The part's weights in bytes, in its configured dtype."""
        per_weight = self.quantized_bytes or BYTES[self.dtype]
        if self.dtype in QUANTIZED_WEIGHT_DTYPES or self.dtype in GGUF_WEIGHT_DTYPES:
            return (self.params - self.plain) * per_weight + self.plain * self.plain_bytes
        return self.params * per_weight

    @property
    def device_bytes(self) -> float:
        """The part's weights on the device: all of them, less the offloaded blocks' share."""
        if not self.params:
            return 0.0
        return self.bytes * (1.0 - self.offloaded / self.params)

    @property
    def loading_bytes(self) -> float:
        """The part in CPU memory as it is read: a quantized file's blocks as they are, else `load_bytes` each."""
        if self.dtype in GGUF_WEIGHT_DTYPES:
            return self.bytes
        return self.params * (self.load_bytes or BYTES[self.dtype])

    @property
    def read_bytes(self) -> float:
        """The part in CPU memory once it is read and put in its form (`families/loading.keep_part`): its weights in
        their dtype, but NFLOAT_4's, which bitsandbytes quantizes only on the CUDA device: they wait as read."""
        return self.loading_bytes if self.dtype is DataType.NFLOAT_4 else self.bytes

    @property
    def block_home_bytes(self) -> float:
        """Layer offloading's CPU copies of the part's moving block weights: every block's, whichever are on the
        device (`memory/layer_offload.py` keeps each block's weights in one page-locked buffer of its exact size)."""
        if not self.params or not self.offload_blocks:
            return 0.0
        return sum(params for _, params in self.offload_blocks) * self.bytes / self.params


@dataclass(frozen=True)
class Activations:
    """What one sample at the run's resolution costs the denoiser's training step, in the training dtype."""

    kept: float  # bytes autograd keeps for the backward pass, without gradient checkpointing
    checkpointed: float  # with it
    flops: float  # the forward's FLOPs
    source: str = "measured"  # how they were found (for the estimate's text)
    block_inputs: float = 0.0  # of `checkpointed`, the blocks' inputs: what activation offloading keeps in CPU memory
    # With checkpointing, where in the passes the activations are held (`_offloaded_step`): the denoiser part, what is
    # kept outside its checkpointed blocks, and each block in execution order as (its name in the part, the bytes its
    # inputs add to those kept, its own saved tensors: what its recomputation holds in the backward pass).
    part: str = ""
    outside: float = 0.0
    blocks: tuple[tuple[str, float, float], ...] = ()


@dataclass(frozen=True)
class Settings:
    batch_size: int
    gradient_checkpointing: bool
    trained_dtype_bytes: float
    optimizer_state_bytes: float
    activations: Activations
    device: str = "cuda"  # the device type that trains: "cuda" (VRAM), "cpu" (RAM), "mps"
    activation_offloading: bool = False  # the denoiser's checkpointed block inputs wait in CPU memory
    # A fine-tune: the trained parameters are the parts' own weights (counted among the weights, gradients in their
    # dtype); else (adapters, embeddings) they are extra parameters in `trained_dtype_bytes`.
    trains_in_place: bool = False
    # Each weight updated as its gradient arrives and the gradient freed: the model's gradients are never held.
    fused_back_pass: bool = False
    ema: str = "OFF"  # the EMA's float32 copy of the trained parameters: "GPU" (on the device), "CPU", "OFF"
    memory_caches: int = 0  # caches that keep entries in memory (latents, text outputs), each up to its limit
    # The base model is one original file: all of its parts are in memory as it is read, before any is put in its form.
    read_at_once: bool = False
    # Several processes, one per GPU (`processes.planned_world_size`): the peak is per GPU, for the configured
    # `multi_gpu_mode` (`MODES`), and the estimate shows each mode's beside it.
    processes: int = 1
    multi_gpu_mode: str = "DATA_PARALLEL"
    sharded_cpu_offload: bool = False  # SHARDED: the shards, their gradients and optimizer state in host RAM
    compute_bytes: float = 2.0  # the train dtype's bytes: a sharded run gathers float32 weights in it
    # MODEL_SPLIT's devices (`checks.split_device_names`), each with the memory the run may use on it (None: not known
    # here, e.g. a GPU this machine lacks: every such device is taken to be of one size, the smallest that holds its
    # share, `_split`). Given for every `multi_gpu` config of two devices or more, so the split's figure is shown
    # beside the other modes'; the configured mode is MODEL_SPLIT when `multi_gpu_mode` says so.
    split_devices: tuple[tuple[str, float | None], ...] = ()


def size_text(size: float) -> str:
    """Bytes for a reader: GiB from 1 GiB, else MiB (KiB below 1 MiB). Every size the estimate and the fit show."""
    if size >= GIB:
        return f"{size / GIB:.1f} GiB"
    if size >= MIB:
        return f"{size / MIB:.{0 if size >= 10 * MIB else 1}f} MiB"
    return f"{size / 1024:.0f} KiB"


def step_time_text(seconds: float) -> str:
    """Seconds per step for a reader: "0.40 s/step", "12 s/step", "3.5 min/step", "9.8 h/step"."""
    if seconds < 10:
        return f"{seconds:.2f} s/step"
    if seconds < 60:
        return f"{seconds:.0f} s/step"
    if seconds < 3600:
        return f"{seconds / 60:.1f} min/step"
    return f"{seconds / 3600:.1f} h/step"


@dataclass
class Estimate:
    peak_bytes: float
    step_seconds: float | None
    parts: dict[str, float] = field(default_factory=dict)  # what the peak is made of, in bytes
    advice: list[str] = field(default_factory=list)
    free_bytes: float | None = None
    device: str = "cuda"  # the device type that trains
    counted_from: str = ""  # where the parameter counts come from
    activations_from: str = ""  # how the activations were found
    # Every part on the device at once (loading, caching, samples): the weights of all parts, the trained parameters,
    # the optimizer's state and the overhead. The peak is the larger of this and the step (`parts`).
    resident_bytes: float = 0.0
    # The process's peak host RAM: the process itself and the larger of the load (every part in CPU memory as it is
    # read) and training (`host_training`); on the CPU the training step's memory is RAM too. `host_parts`: what that
    # peak is made of.
    host_bytes: float = 0.0
    host_parts: dict[str, float] = field(default_factory=dict)
    host_loading: float = 0.0
    host_training: float = 0.0
    # SHARDED on several processes: the host RAM of all of them together at its peak (`_sharded_host_all`); 0 else.
    host_all_bytes: float = 0.0
    # The config names a CUDA device this machine lacks: the CPU trains, and the time per step is the CPU's.
    no_gpu: bool = False
    # Several processes: how many, the configured mode's name (`MODES`' label) and each mode's peak per GPU.
    processes: int = 1
    mode: str = ""
    modes: dict[str, float] = field(default_factory=dict)
    # A model split (the configured mode): each device's peak by its name, and which of the blocks it holds.
    devices: dict[str, float] = field(default_factory=dict)
    device_blocks: dict[str, str] = field(default_factory=dict)

    @property
    def machine_host_bytes(self) -> float:
        """The host RAM the run takes of its machine: a sharded run's processes together, else the process's peak."""
        return self.host_all_bytes or self.host_bytes

    @property
    def gpus(self) -> int:
        """The GPUs the peak is per: the processes, or the devices of a model split."""
        return max(self.processes, len(self.devices))

    @property
    def fits(self) -> bool | None:
        return None if self.free_bytes is None else self.peak_bytes <= self.free_bytes

    @property
    def memory(self) -> str:
        """What memory the peak is of: VRAM on CUDA, the CPU's RAM without a GPU."""
        return {"cuda": "VRAM", "cpu": "CPU memory (RAM)"}.get(self.device, f"{self.device.upper()} memory")

    @property
    def on_the_cpu(self) -> str:
        """Where the CPU trains, saying so (and why, where the config asked for a GPU); else empty."""
        if self.device != "cpu":
            return ""
        return "on the CPU (no CUDA GPU found)" if self.no_gpu else "on the CPU"

    def summary(self) -> str:
        """One line beside Start: "≈ 5.1 GiB VRAM · 9.3 GiB RAM · 0.40 s/step"; where the CPU trains, its RAM alone:
        "≈ 1.1 GiB RAM · 9.8 h/step on the CPU (no CUDA GPU found)"."""
        step = f" · {step_time_text(self.step_seconds)}" if self.step_seconds is not None else ""
        if self.device == "cpu":
            return f"≈ {size_text(self.host_bytes)} RAM{step} {self.on_the_cpu}"
        per_gpu = " per GPU" if self.gpus > 1 else ""
        return f"≈ {size_text(self.peak_bytes)} {self.memory}{per_gpu} · {size_text(self.host_bytes)} RAM{step}"

    def text(self) -> str:
        if self.device == "cpu":  # the step's memory is RAM too: the process's peak is the figure
            peak = f"estimated peak {self.memory} {size_text(self.host_bytes)}, training {self.on_the_cpu}"
            step_parts = "  the step: "
        else:
            peak = f"estimated peak {self.memory} {size_text(self.peak_bytes)}"
            if self.devices:
                peak += f" per GPU (the fullest of {len(self.devices)} devices, one process, {self.mode})"
            elif self.processes > 1:
                peak += f" per GPU ({self.processes} processes, {self.mode})"
            if self.free_bytes is not None:
                peak += f" (free: {size_text(self.free_bytes)})"
            step_parts = "  "
        step = f", about {step_time_text(self.step_seconds)}" if self.step_seconds is not None else ""
        lines = [peak + step]
        if len(self.modes) > 1 and self.device != "cpu":
            shown = ", ".join(f"{label} {size_text(peak)}" for label, peak in self.modes.items())
            lines.append(f"  per GPU in each mode (multi_gpu_mode): {shown}")
        if self.devices:
            shown = ", ".join(
                f"{name} {size_text(peak)} ({self.device_blocks.get(name, 'no blocks')})"
                for name, peak in self.devices.items()
            )
            lines.append(f"  each device of the split: {shown}")
        lines.append(step_parts + ", ".join(f"{k} {size_text(v)}" for k, v in self.parts.items()))
        if self.resident_bytes > sum(self.parts.values()):
            lines.append(
                f"  the peak is while every part is on the device ({self._whole_moment()}): "
                f"{size_text(self.resident_bytes)}; a training step needs {size_text(sum(self.parts.values()))}"
            )
        per_process = " per process" if self.processes > 1 else ""
        lines.append(f"  host RAM{per_process} {size_text(self.host_bytes)} at its peak: {self.host_text()}")
        if self.host_all_bytes:
            lines.append(
                f"  host RAM of the {self.processes} processes together {size_text(self.host_all_bytes)} at its peak "
                "(they read the model one at a time: the others hold their frozen parts)"
            )
        if self.counted_from:
            lines.append(f"  parameters counted from {self.counted_from}")
        if self.activations_from:
            lines.append(f"  activations {self.activations_from}")
        if self.fits is False:
            lines.append("  does not fit; these bring it under:" if self.advice else "  does not fit")
            lines += [f"  - {a}" for a in self.advice]
        return "\n".join(lines)

    def _whole_moment(self) -> str:
        """When every part is on the device at once."""
        if self.mode == MODES["SHARDED"].label:
            return "loading, filling the caches: the trained parts wait in RAM and are sharded a block at a time after"
        return "loading, filling the caches, samples"

    def host_text(self) -> str:
        """What the host RAM's peak is made of, and the other moment's figure."""
        shown = ", ".join(f"{k} {size_text(v)}" for k, v in self.host_parts.items() if v)
        if self.host_loading >= self.host_training:
            return f"{shown} (while training: {size_text(self.host_training)})"
        return f"{shown} (while loading: {size_text(self.host_loading)})"


def estimate_from_counts(
    counts: dict[str, PartCount], settings: Settings, flops_per_second: float | None = None
) -> Estimate:
    """Peak bytes and seconds per step from parameter counts (see the module docstring for the model). With several
    processes, the peak per GPU of the configured `multi_gpu_mode`, and in `modes` each mode's that applies. A model
    split (one process over `Settings.split_devices`) is per GPU too, its devices' figures in `devices`; the other
    modes are then figured over as many GPUs."""
    split = settings.multi_gpu_mode == "MODEL_SPLIT" and len(settings.split_devices) >= 2
    if settings.processes <= 1 and not split:
        return _one_process(counts, settings, flops_per_second)
    gpus = settings.processes if settings.processes > 1 else len(settings.split_devices)
    each = replace(settings, processes=gpus)
    results = {
        name: mode.per_gpu(counts, each, flops_per_second) for name, mode in MODES.items() if mode.applies(counts, each)
    }
    name = settings.multi_gpu_mode if settings.multi_gpu_mode in results else "DATA_PARALLEL"
    result = results[name]
    result.processes, result.mode = (1 if name == "MODEL_SPLIT" else gpus), MODES[name].label
    result.modes = {MODES[n].label: r.peak_bytes for n, r in results.items()}
    return result


def _one_process(counts: dict[str, PartCount], settings: Settings, flops_per_second: float | None) -> Estimate:
    """One process's peak: on one GPU, or on each GPU of a data-parallel run (every GPU holds the whole run)."""
    weights = sum(c.device_bytes for c in counts.values() if c.on_device)
    trained = sum(c.trained for c in counts.values())
    if settings.trains_in_place:
        stored = 0.0  # the weights themselves, counted above
        gradients = sum(c.trained * BYTES[c.dtype] for c in counts.values())
    else:
        stored = gradients = trained * settings.trained_dtype_bytes
    if settings.fused_back_pass:  # one weight's gradient at a time, and the optimizer's float32 work on it
        gradients = max((c.largest_trained * (BYTES[c.dtype] + FUSED_STEP_WORK) for c in counts.values()), default=0.0)
    state = (trained - sum(c.trained_offloaded for c in counts.values())) * settings.optimizer_state_bytes
    if settings.ema == "GPU":  # the EMA's float32 copy of the trained parameters beside them
        state += trained * 4.0
    trained_bytes = stored + gradients + state
    per_sample = settings.activations
    kept = per_sample.checkpointed if settings.gradient_checkpointing else per_sample.kept
    if settings.gradient_checkpointing and settings.activation_offloading:
        kept -= per_sample.block_inputs
    activations = kept * settings.batch_size
    denoiser = counts.get(per_sample.part)
    at_peak = _offloaded_step(denoiser, settings) if denoiser is not None and denoiser.on_device else None
    if at_peak is not None:  # the denoiser's window and the activations where together they are largest
        weights += at_peak[0] - denoiser.device_bytes
        activations = at_peak[1]
    parts = {"weights": weights, "training state": trained_bytes, "activations": activations}
    if settings.device == "cuda":
        parts["overhead"] = OVERHEAD
    seconds = None
    if flops_per_second:
        passes = 4 if settings.gradient_checkpointing else 3
        seconds = per_sample.flops * settings.batch_size * passes / flops_per_second
    resident = sum(c.device_bytes for c in counts.values()) + stored + state + parts.get("overhead", 0.0)
    step = sum(parts.values())
    result = Estimate(max(step, resident), seconds, parts, device=settings.device, resident_bytes=resident)
    _add_host(result, counts, settings)
    return result


def _sharded(counts: dict[str, PartCount], settings: Settings, flops_per_second: float | None) -> Estimate:
    """Each GPU's peak in a sharded fine-tune (`training/sharding.py`): the trained parts' weights, gradients and
    optimizer state divided by the processes; the units in flight whole — the block being computed and the next one
    (FSDP2 gathers one ahead) in the dtype they are gathered in, and one block's full gradients in float32 before
    they are reduce-scattered (a part without declared blocks is one unit); the frozen parts and the activations as
    one process has them. `sharded_cpu_offload` (on a GPU) moves the shards and their gradients and optimizer state
    to host RAM. The other moment: loading and filling the caches, the frozen parts whole on each GPU while the
    trained parts wait in host RAM (the trainer shards them from there, a block at a time: one unit whole on the GPU
    as it is cut). An EMA is sharded as the weights are (1/N of its float32 copy on each GPU, or in host RAM)."""
    n = settings.processes
    one = _one_process(counts, settings, flops_per_second)
    sharded = {k: c for k, c in counts.items() if c.trained and c.on_device}
    whole = one.parts["weights"] - sum(c.device_bytes for c in sharded.values())
    shards = sum(c.bytes for c in sharded.values()) / n
    gradients = sum(c.trained * BYTES[c.dtype] for c in sharded.values()) / n
    state = sum(c.trained for c in sharded.values()) * settings.optimizer_state_bytes / n
    if settings.ema == "GPU":  # each process averages its own shard
        state += sum(c.trained for c in sharded.values()) * 4.0 / n
    in_flight = max((_unit(c) * (2 * _gathered_bytes(c, settings) + 4.0) for c in sharded.values()), default=0.0)
    held = shards + gradients + state
    offloaded = settings.sharded_cpu_offload and settings.device == "cuda"
    parts = {
        "weights (frozen parts)": whole,
        f"shards (1/{n} of the trained weights, gradients, optimizer state)": 0.0 if offloaded else held,
        "gathered blocks": in_flight,
        "activations": one.parts["activations"],
    }
    if "overhead" in one.parts:
        parts["overhead"] = one.parts["overhead"]
    cutting = max((_unit(c) * c.bytes / c.params for c in sharded.values() if c.params), default=0.0)
    resident = whole + cutting + parts.get("overhead", 0.0)
    step = sum(parts.values())
    result = Estimate(max(step, resident), one.step_seconds, parts, device=settings.device, resident_bytes=resident)
    _add_host(result, counts, settings, {"the shards (sharded_cpu_offload)": held} if offloaded else None, 1 / n)
    result.host_all_bytes = _sharded_host_all(result, counts, sharded, settings)
    return result


def _sharded_host_all(
    result: Estimate, counts: dict[str, PartCount], sharded: dict[str, PartCount], settings: Settings
) -> float:
    """The host RAM of a sharded run's N processes together at its peak. They read the model one at a time, rank 0
    last (`sharding.load_in_turns`): each other process lets go of the weights of the parts to shard once it has read
    them, so while rank 0 reads (the largest moment of loading) the others hold their frozen parts as kept, not a whole
    model each; rank 0 sends each its shards when they are cut. Training: each process's own figure (its shards there
    with `sharded_cpu_offload`), N times."""
    n = settings.processes
    if n <= 1:
        return 0.0
    frozen = sum(c.read_bytes for name, c in counts.items() if name not in sharded)
    process = result.host_parts.get("the process", HOST_PROCESS)
    return n * process + max(result.host_loading + (n - 1) * frozen, n * result.host_training)


def _unit(count: PartCount) -> int:
    """The parameters a sharded part gathers at a time: its largest declared block, else the whole part."""
    return count.largest_block or count.params


def _gathered_bytes(count: PartCount, settings: Settings) -> float:
    """Bytes per weight as a sharded part's blocks are gathered: float32 weights in the 16-bit train dtype (FSDP2's
    mixed precision), others in their own."""
    return min(settings.compute_bytes, 4.0) if count.dtype is DataType.FLOAT_32 else BYTES[count.dtype]


def _split_part(counts: dict[str, PartCount]) -> str | None:
    """The part a model split spreads (the one with declared blocks counted for it: a LoRA's denoiser), or None."""
    return next((name for name, count in counts.items() if len(count.split_blocks) >= 2), None)


def _split_applies(counts: dict[str, PartCount], settings: Settings) -> bool:
    """A model split: a LoRA (adapters beside frozen weights) on a GPU, whose denoiser declares its blocks and is not
    layer-offloaded (`checks.check_model_split` refuses both), over two devices or more."""
    part = _split_part(counts)
    return (
        part is not None
        and not settings.trains_in_place
        and settings.device == "cuda"
        and len(settings.split_devices) >= 2
        and not counts[part].offloaded
    )


def _split(counts: dict[str, PartCount], settings: Settings, flops_per_second: float | None) -> Estimate:
    """Each device's peak in a model split (`memory/model_split.py`, one process): the denoiser's declared blocks
    spread over `Settings.split_devices` by `assign_blocks`, the function the run's `placement.split_denoiser` uses,
    with the budgets it gives it: each device's memory less the CUDA context, the first device's less what is there
    when the split is made (every other part, counted whole, and the denoiser outside its blocks with its adapters); a
    block's size is its weights in their stored dtype and its adapters in the LoRA dtype. A device's peak: its blocks'
    weights and its adapters' share of the training state (weights, gradients, optimizer state, a GPU EMA: the state
    per adapter parameter as one process has it), its activations (`_split_activations`) and the overhead; the first
    device also holds everything outside the blocks as one process does. Devices of unknown memory (GPUs this machine
    lacks) are taken to be of one size: the smallest at which each holds its share (found by halving; the first
    device's share grows with the size). The step's time is one device's: the devices take turns. A CPU device's
    figure is host RAM (added to it); the peak is the fullest GPU's."""
    from onetrainer.memory.model_split import SplitError, assign_blocks

    one = _one_process(counts, settings, flops_per_second)
    part = _split_part(counts)
    denoiser = counts[part]
    blocks = denoiser.split_blocks
    per_weight = denoiser.bytes / denoiser.params
    names = [name for name, _ in settings.split_devices]
    cuda = [name.startswith("cuda") for name in names]
    n = len(names)
    sizes = [params * per_weight + adapters * settings.trained_dtype_bytes for _, params, adapters in blocks]
    block_params = sum(params for _, params, _ in blocks)
    block_adapters = sum(adapters for _, _, adapters in blocks)
    rest = (denoiser.params - block_params) * per_weight
    rest += (denoiser.trained - block_adapters) * settings.trained_dtype_bytes
    # When the split is made every part the step or the caching uses is on the first device (not only those the step
    # keeps there): every other part is counted, which a part used only for samples overstates.
    first_held = sum(c.device_bytes for k, c in counts.items() if k != part) + rest
    trained = sum(c.trained for c in counts.values())
    overhead = one.parts.get("overhead", 0.0)
    state_per = one.parts["training state"] / trained if trained else 0.0
    weights_all = sum(c.device_bytes for c in counts.values())
    resident_per = (one.resident_bytes - weights_all - overhead) / trained if trained else 0.0

    def assign(size: float) -> list[int]:
        budgets = []
        for d, (_name, memory) in enumerate(settings.split_devices):
            budget = (size if memory is None else memory) - (OVERHEAD if cuda[d] else 0.0)
            budgets.append(max(0.0, budget - (first_held if d == 0 else 0.0)))
        try:
            return assign_blocks(sizes, budgets)
        except SplitError:  # no device has room (the run refuses it): every block on the last device
            return [n - 1] * len(sizes)

    def figures(assignment: list[int]) -> tuple[list[dict[str, float]], list[float]]:
        weights, adapters = [0.0] * n, [0.0] * n
        for (_, params, adapter), d in zip(blocks, assignment):
            weights[d] += params * per_weight
            adapters[d] += adapter
        activations = _split_activations(one.parts["activations"], settings, blocks, sizes, assignment, n)
        moved_weights, moved_adapters = sum(weights[1:]), sum(adapters[1:])
        steps, resident = [], []
        for d in range(n):
            if d == 0:  # everything outside the blocks, as one process holds it, less the blocks elsewhere
                step = {
                    "weights": one.parts["weights"] - moved_weights,
                    "training state": one.parts["training state"] - moved_adapters * state_per,
                    "activations": activations[0],
                }
                held = one.resident_bytes - overhead - moved_weights - moved_adapters * resident_per
            else:
                step = {
                    "weights": weights[d],
                    "training state": adapters[d] * state_per,
                    "activations": activations[d],
                }
                held = weights[d] + adapters[d] * resident_per
            if cuda[d]:
                step["overhead"] = OVERHEAD
                held += OVERHEAD
            steps.append(step)
            resident.append(held)
        return steps, resident

    def peaks(assignment: list[int]) -> list[float]:
        steps, resident = figures(assignment)
        return [max(sum(step.values()), held) for step, held in zip(steps, resident)]

    unknown = [d for d, (_, memory) in enumerate(settings.split_devices) if memory is None]
    size = 0.0
    if unknown:
        low, high = 0.0, one.peak_bytes  # at one device's peak each device holds its share: none holds more
        for _ in range(40):
            middle = (low + high) / 2
            found = peaks(assign(middle))
            if all(found[d] <= middle for d in unknown):
                high = middle
            else:
                low = middle
        size = high
    assignment = assign(size)
    steps, resident = figures(assignment)
    device_peaks = [max(sum(step.values()), held) for step, held in zip(steps, resident)]
    on_gpus = [d for d in range(n) if cuda[d]] or list(range(n))
    fullest = max(on_gpus, key=lambda d: device_peaks[d])
    peak = device_peaks[fullest]
    result = Estimate(peak, one.step_seconds, steps[fullest], device=settings.device, resident_bytes=resident[fullest])
    result.devices = dict(zip(names, device_peaks))
    result.device_blocks = {names[d]: _block_span(assignment, d) for d in range(n)}
    on_cpu = sum(device_peaks[d] for d in range(1, n) if not cuda[d])
    _add_host(result, counts, settings, {"split blocks on the CPU": on_cpu} if on_cpu else None)
    return result


def _block_span(assignment: list[int], device: int) -> str:
    """ "blocks 0–27": a device's blocks in a split's assignment ("no blocks" where it has none)."""
    indexes = [i for i, d in enumerate(assignment) if d == device]
    if not indexes:
        return "no blocks"
    return f"block {indexes[0]}" if len(indexes) == 1 else f"blocks {indexes[0]}–{indexes[-1]}"


def _split_activations(
    total: float,
    settings: Settings,
    blocks: tuple[tuple[str, int, int], ...],
    sizes: list[float],
    assignment: list[int],
    n: int,
) -> list[float]:
    """Each split device's activations (`total`: one process's). The rule: a block's tensors live where the block
    runs, so the activations follow the blocks. With gradient checkpointing (from the measured block calls,
    `Activations.blocks`) a device holds the inputs checkpointing keeps for the blocks after its own (a block's added
    input is the previous block's output, kept on the device that made it; in CPU memory with activation offloading)
    and the largest of its blocks' own tensors, recomputed one block at a time in the backward pass; the first device
    holds what is kept outside the blocks too. So under checkpointing a device's activations shrink with its share of
    the blocks but never below one block's recomputation, and the sum over the devices exceeds one device's figure by
    one recomputed block on each other device. Without checkpointing, the blocks' part of all that is kept (`kept`
    less what is outside them) is shared as the blocks' own tensors are. Without measured blocks (the per-parameter
    rule) the activations are shared as the blocks' bytes are."""
    per_sample = settings.activations
    device_of = {name: assignment[i] for i, (name, _, _) in enumerate(blocks)}
    calls = per_sample.blocks
    if not calls or not any(name in device_of for name, _, _ in calls):
        share = [0.0] * n
        for size, d in zip(sizes, assignment):
            share[d] += size
        whole = sum(share) or 1.0
        return [total * s / whole for s in share]
    out, largest, own_sums = [0.0] * n, [0.0] * n, [0.0] * n
    out[0] = per_sample.outside
    before = 0  # the device that made the running block's input
    for name, inputs, own in calls:
        d = device_of.get(name, 0)  # a checkpointed module that is not a declared block runs on the first device
        if settings.gradient_checkpointing and not settings.activation_offloading:
            out[before] += inputs
        largest[d] = max(largest[d], own)
        own_sums[d] += own
        before = d
    if settings.gradient_checkpointing:
        out = [o + m for o, m in zip(out, largest)]
    else:
        in_blocks = max(per_sample.kept - per_sample.outside, 0.0)
        whole = sum(own_sums) or 1.0
        out = [o + in_blocks * s / whole for o, s in zip(out, own_sums)]
    return [o * settings.batch_size for o in out]


class Mode(NamedTuple):
    """A `multi_gpu_mode` the estimate knows: its label, whether it applies to a run, and each GPU's peak in it."""

    label: str
    applies: Callable[[dict[str, PartCount], Settings], bool]
    per_gpu: Callable[[dict[str, PartCount], Settings, float | None], Estimate]


# Several processes: every mode the estimate figures (the configured one is the peak; the others are shown beside it).
MODES: dict[str, Mode] = {
    "DATA_PARALLEL": Mode("data parallel", lambda counts, settings: True, _one_process),
    "SHARDED": Mode(
        "sharded",
        lambda counts, settings: settings.trains_in_place and any(c.trained and c.on_device for c in counts.values()),
        _sharded,
    ),
    "MODEL_SPLIT": Mode("model split", _split_applies, _split),
}


def _add_host(
    result: Estimate,
    counts: dict[str, PartCount],
    settings: Settings,
    extra: dict[str, float] | None = None,
    share: float = 1.0,
) -> None:
    """The process's host RAM, as the trainer holds it (`training/placement.py`, `memory/layer_offload.py`).

    Loading (`_loading_bytes`) reads the parts one at a time, in the family's declared order (the order of `counts`),
    each in the dtype it is read in (`PartCount.load_bytes`) and put in its form (quantized, or cast) before the next
    is read (`families/loading.KeptParts`). While training, the CPU keeps: the parts not on the device (encoders whose
    outputs are cached, parts used only for samples) in their weight dtype; with layer offloading, every block's
    moving weights in page-locked buffers (the window on the device is a copy), and for offloaded trained blocks their
    optimizer state (torch's pinned allocator); with activation offloading, the checkpointed blocks' inputs; an EMA on
    the CPU; the caches' entries kept in memory (each up to its limit). Where the CPU trains, the step's own memory
    (`peak_bytes`) is RAM as well. Not counted: the images being loaded, a sample being rendered, the operating
    system's file cache."""
    from onetrainer.data.cache import MEMORY_LIMIT_BYTES

    per_sample = settings.activations
    offloaded_inputs = settings.gradient_checkpointing and settings.activation_offloading
    training = {
        "the step": result.peak_bytes if settings.device == "cpu" else 0.0,
        "parts kept in RAM": sum(c.bytes for c in counts.values() if not c.on_device),
        "offloaded blocks (pinned)": sum(c.block_home_bytes for c in counts.values() if c.on_device),
        "their optimizer state (pinned)": sum(c.trained_pinned for c in counts.values())
        * settings.optimizer_state_bytes,
        "offloaded activations": per_sample.block_inputs * settings.batch_size if offloaded_inputs else 0.0,
        "EMA": sum(c.trained for c in counts.values()) * 4.0 * share if settings.ema == "CPU" else 0.0,
        "caches in memory (at most)": settings.memory_caches * MEMORY_LIMIT_BYTES,
        **(extra or {}),
    }
    process = HOST_PROCESS + (HOST_CUDA_RUNTIME if settings.device == "cuda" else 0.0)
    result.host_loading = _loading_bytes(counts, settings.read_at_once)
    result.host_training = sum(training.values())
    if result.host_loading >= result.host_training:
        result.host_parts = {"the process": process, LOADING: result.host_loading}
    else:
        result.host_parts = {"the process": process, **training}
    result.host_bytes = process + max(result.host_loading, result.host_training)


LOADING = "loading (the part being read, those before it as kept)"


def _loading_bytes(counts: dict[str, PartCount], at_once: bool = False) -> float:
    """The host RAM loading holds at its largest, `counts` in the order the parts are read: the part being read, in
    the dtype it is read in, beside the parts read before it as they are kept (`PartCount.read_bytes`: a FLOAT_8 part
    at 1 byte a weight once quantized, where it was read in 2). Quantizing a part replaces its weights one layer at a
    time (`precision/quantize.py`): one layer's quantized copy (tens of MiB) is not counted. `at_once`: one original
    file holding the whole model, all of whose parts are in memory as read before any is put in its form (an upper
    bound where the file holds some of them and the rest are read after it)."""
    if at_once:
        return sum(c.loading_bytes for c in counts.values())
    largest = kept = 0.0
    for count in counts.values():
        largest = max(largest, kept + count.loading_bytes)
        kept += count.read_bytes
    return largest


def _offloaded_step(count: PartCount, settings: Settings) -> tuple[float, float] | None:
    """The offloaded denoiser's weights on the device and the activations held, at the point of the step where the two
    together are largest; None where that point is not known (no checkpointing, no measured blocks, blocks of other
    names), and the largest window and the activations' largest are added.

    The window of `count.window` blocks slides as `memory/layer_offload.py` slides it: in the forward pass it holds the
    block that runs and the ones after it, in the backward pass the block that runs and the ones before it; it waits
    at the last blocks between the passes and at the first ones before the forward pass (a block the part checkpoints
    that is not one of the offloaded blocks runs with the window where the last of them left it). The activations at a
    block, in either pass: what is kept outside the blocks, the inputs of the blocks up to it (checkpointing keeps each
    until the backward pass has been through its block; in CPU memory with activation offloading), and the block's own
    tensors (recomputed in the backward pass). Large early blocks and activations that grow to the end of the forward
    pass are then not counted at their largest together, as they never are."""
    per_sample = settings.activations
    if not (settings.gradient_checkpointing and per_sample.blocks and count.offload_blocks and count.window):
        return None
    order = {name: i for i, (name, _) in enumerate(count.offload_blocks)}
    sizes = [params for _, params in count.offload_blocks]
    window = min(count.window, len(sizes))
    at = [order.get(name) for name, _, _ in per_sample.blocks]
    if all(i is None for i in at):
        return None
    largest = _largest_window(sizes, window)
    per_param = count.bytes / count.params

    def weights(first: int) -> float:  # the part's weights with the window from block `first`
        return count.device_bytes - (largest - sum(sizes[first : first + window])) * per_param

    best: tuple[float, float] | None = None
    held = per_sample.outside
    for (_name, inputs, own), starts in zip(per_sample.blocks, window_starts(at, len(sizes), window)):
        if not settings.activation_offloading:
            held += inputs
        resident = max(weights(first) for first in starts)
        activations = (held + own) * settings.batch_size
        if best is None or resident + activations > best[0] + best[1]:
            best = (resident, activations)
    return best


def _largest_window(sizes: list[int], window: int) -> int:
    """The most parameters `window` consecutive blocks of these sizes hold: what layer offloading's window can hold."""
    return max(sum(sizes[i : i + window]) for i in range(len(sizes) - window + 1))


def window_starts(at: list[int | None], blocks: int, window: int) -> list[tuple[int, int]]:
    """Layer offloading's window (`memory/layer_offload.py`) while each of a part's checkpointed blocks runs: the first
    of the `window` blocks on the device in the forward pass and in the backward pass. `at`: each checkpointed block's
    place among the `blocks` offloaded ones, in execution order (None: not one of them)."""
    starts = []
    forward_at = 0  # before the first offloaded block: where the last backward pass (or attaching) left the window
    for step, here in enumerate(at):
        forward_at = here if here is not None else forward_at
        # after the last offloaded block: where the forward pass left it
        backward_at = next((i for i in at[step:] if i is not None), blocks - 1)
        starts.append((min(forward_at, blocks - window), max(backward_at, window - 1) - window + 1))
    return starts


def training_device_type(name: str) -> str:
    """The device type that will train for a configured `train_device`: the CPU where CUDA (or MPS) is missing, as
    training falls back to it (`devices.select_device`)."""
    from onetrainer.training.devices import select_device

    try:
        return select_device(name, lambda _text: None).type
    except (RuntimeError, ValueError):  # not a device name: the config check reports it
        return "cpu"


def family_of(config: TrainConfig) -> Family:
    """The family object of the config's model type (its declarations and calls); ValueError for a type no family
    trains, which the callers show as the estimate's message."""
    from onetrainer.families import load_family_class

    try:
        return load_family_class(config.model_type)()
    except (NotImplementedError, KeyError) as error:
        raise ValueError(f"no estimate for {config.model_type.value}: {error}") from None


def stepping_denoiser(config: TrainConfig) -> str:
    """The denoiser whose step the estimate measures and whose settings it reads: the first that the run's steps run
    (of experts, the first whose noise levels the noising range reaches; they share a shape)."""
    info = family_of(config).info
    stepping = info.stepping_experts(float(config.min_noising_strength), float(config.max_noising_strength))
    return stepping[0] if stepping else info.parts[0]


def settings_of(config: TrainConfig, activations: Activations, device_memory: float | None = None) -> Settings:
    """The estimate's settings of a config. `device_memory`: the memory of each GPU a model split would use (the fit
    passes its budget); None: each GPU's own where this machine has it (`split_memory`)."""
    from onetrainer.data.caching import text_encoders_frozen
    from onetrainer.training.processes import planned_world_size

    trained_dtype = config.lora_weight_dtype if config.training_method is TrainingMethod.LORA else DataType.FLOAT_32
    return Settings(
        batch_size=config.batch_size,
        gradient_checkpointing=bool(config.part(stepping_denoiser(config)).gradient_checkpointing),
        trained_dtype_bytes=BYTES[trained_dtype],
        optimizer_state_bytes=optimizer_state_bytes(
            config.optimizer.optimizer, config.optimizer.beta1, config.optimizer
        ),
        activations=activations,
        device=training_device_type(config.train_device),
        trains_in_place=config.training_method is TrainingMethod.FINE_TUNE,
        activation_offloading=bool(config.part(stepping_denoiser(config)).activation_offloading),
        fused_back_pass=bool(config.optimizer.fused_back_pass)
        and config.training_method is not TrainingMethod.EMBEDDING,
        ema=config.ema.value,
        memory_caches=(1 + text_encoders_frozen(config)) if config.latent_caching else 0,
        read_at_once=_one_file(config.base_model_name),
        processes=planned_world_size(config),
        multi_gpu_mode=config.multi_gpu_mode.value,
        sharded_cpu_offload=bool(config.sharded_cpu_offload),
        compute_bytes=BYTES.get(config.train_dtype, 2.0),
        split_devices=split_memory(config, device_memory),
    )


def split_memory(config: TrainConfig, device_memory: float | None = None) -> tuple[tuple[str, float | None], ...]:
    """A `multi_gpu` config's model-split devices (`checks.split_device_names`: `split_devices`, else the GPUs of
    `device_indexes`, else every visible GPU), each with the memory the run could use on it: `device_memory` for a GPU
    where given, else the GPU's total memory where this machine has it (not its free memory: asking that would open a
    CUDA context on every GPU from the window), None where it lacks it; for the CPU the RAM available. Empty: not
    `multi_gpu`, or fewer than two devices."""
    if not config.multi_gpu:
        return ()
    from onetrainer.training.device_lists import split_device_names

    try:
        names = split_device_names(config)
    except ValueError:  # the checks name the field
        return ()
    if len(names) < 2:
        return ()
    import torch

    out: list[tuple[str, float | None]] = []
    for name in names:
        device = torch.device(name)
        memory: float | None = None
        if device.type == "cpu":
            import psutil

            memory = float(psutil.virtual_memory().available)
        elif device.type == "cuda" and device_memory is not None:
            memory = float(device_memory)
        elif device.type == "cuda" and torch.cuda.is_available():
            index = device.index if device.index is not None else torch.cuda.current_device()
            if index < torch.cuda.device_count():
                memory = float(torch.cuda.get_device_properties(index).total_memory)
        out.append((name, memory))
    return tuple(out)


def _one_file(name: str) -> bool:
    """Whether the base model is one original file holding every part (a single-file checkpoint), read together."""
    from onetrainer.families.sources import ModelNotFound, resolve_source

    try:
        return resolve_source(name).kind == "single_file"
    except ModelNotFound:
        return False


def counts_of(config: TrainConfig, shapes: dict[str, dict]) -> dict[str, PartCount]:
    """Per part, in the family's declared order (the order loading reads them in): its size, dtype, whether it is on
    the device while stepping, and what trains on it, from the roles the family declares."""
    from onetrainer.data.caching import text_encoders_frozen
    from onetrainer.families.base import PartRole
    from onetrainer.methods.base import layer_filter_patterns
    from onetrainer.util.layer_filter import name_matches

    family = family_of(config)
    cached = config.latent_caching
    # The trainer caches the text encoders' outputs only when none of them (nor an embedding) trains.
    text_cached = cached and text_encoders_frozen(config)
    plain_bytes = BYTES.get(config.train_dtype, 2.0)
    patterns, regex = layer_filter_patterns(config, family)  # what the methods apply to the denoiser
    from onetrainer.config.model_types import left_out

    counts = {}
    # Experts (`FamilyInfo.expert_boundary`) whose noise levels the noising range leaves out wait off the device.
    stepping = family.info.stepping_experts(float(config.min_noising_strength), float(config.max_noising_strength))
    order = {part: i for i, part in enumerate(family.info.parts)}
    for part, info in sorted(shapes.items(), key=lambda item: order.get(item[0], len(order))):
        if left_out(config, part):
            continue  # never loaded
        role = family.part_roles.get(part, PartRole.SAMPLING)
        part_config = config.part(part)
        text = role is PartRole.TEXT_ENCODER
        denoiser = role is PartRole.DENOISER
        train = bool(getattr(part_config, "train", False)) and (denoiser or text)
        largest = 0
        split_blocks: tuple[tuple[str, int, int], ...] = ()
        if config.training_method is TrainingMethod.FINE_TUNE:
            tensors = info.get("tensors", [])
            if not train:
                trained = 0
            elif denoiser and patterns and tensors:
                counts_trained = [count for name, count in tensors if name_matches(name, patterns, regex)]
                trained, largest = sum(counts_trained), max(counts_trained, default=0)
            else:
                trained = info["params"]
                largest = max((count for _, count in tensors), default=0)
        elif config.training_method is TrainingMethod.LORA and train:
            layers = info["layers"]
            if denoiser:
                layers = [layer for layer in layers if name_matches(layer[0], patterns, regex)]
            trained = _adapter_params(config, layers, denoiser, family.text_encoder_blocks)
            if denoiser:
                split_blocks = _split_blocks(config, family, part, info, layers)
        else:
            trained = 0
        if denoiser and part not in stepping and not train:
            on_device = False
        elif denoiser or train:
            on_device = True
        elif role is PartRole.SAMPLING:
            on_device = False
        else:  # text encoders and image encoders work every step unless their outputs are cached
            on_device = not (text_cached if text else cached)
        kept = set(info.get("kept", ()))
        quantized = sum(
            fan_in * fan_out * area
            for name, fan_in, fan_out, area in info["layers"]
            if not kept.intersection(name.split("."))
        )
        offload = _offloaded_params(config, family, part, info, trained)
        counts[part] = PartCount(
            info["params"], part_config.weight_dtype, on_device, trained, text, info["params"] - quantized, plain_bytes,
            offload.offloaded, _gguf_bytes(part_config), offload.trained_offloaded, offload.blocks, offload.window,
            largest, _load_bytes(config, part, info), offload.trained_pinned, _largest_block(family, part, info),
            split_blocks,
        )  # fmt: skip
    return counts


def _load_bytes(config: TrainConfig, part: str, info: dict) -> float:
    """Bytes per parameter while the part is read: in the dtype every loading path reads it in
    (`families/loading.load_data_type`: its weight dtype, the training dtype for a quantized kind); where its library
    reads it as its files store it (`stored_bytes`: a transformers config that names no dtype) and it is cast
    afterwards, the larger."""
    from onetrainer.families.loading import load_data_type

    return max(BYTES[load_data_type(config, part)], info.get("stored_bytes", 0.0))


def _gguf_bytes(part_config) -> float | None:
    """Bytes per quantized weight of a part read from a .gguf file, from the file's header; None otherwise."""
    if part_config.weight_dtype not in GGUF_WEIGHT_DTYPES:
        return None
    from onetrainer.config.parts import is_gguf_file
    from onetrainer.precision.gguf_weights import gguf_bytes_per_weight

    name = (getattr(part_config, "model_name", "") or "").strip()
    return gguf_bytes_per_weight(name) if is_gguf_file(name) else None


class _Offload(NamedTuple):
    offloaded: int = 0  # block parameters off the device at its fullest
    trained_offloaded: int = 0  # of them, trained (their optimizer state is off the device with them)
    blocks: tuple[tuple[str, int], ...] = ()  # each block with the parameters that move with it, in execution order
    window: int = 0  # blocks on the device at a time
    trained_pinned: float = 0.0  # `PartCount.trained_pinned`


def _offloaded_params(config: TrainConfig, family: Family, part: str, info: dict, trained: int) -> _Offload:
    """The block parameters layer offloading keeps off the device at its fullest, how many of them train, each block
    with the parameters that move with it, and the window (blocks on the device at a time). Off the device at its
    fullest: all of the blocks' but the largest window of consecutive blocks (`Family.layer_blocks`, in execution
    order), since the window slides over blocks that need not be of one size (a dual-stream block can be twice a
    single-stream one); where in the passes that is, the estimate finds from the blocks (`_offloaded_step`). A
    fine-tune's trained parameters, inside the blocks, move only with the fused back pass; else they stay."""
    import re

    from onetrainer.config.model_types import LAYER_OFFLOADING

    fraction = config.part(part).offload_fraction
    paths = family.layer_blocks.get(part, ())
    if fraction <= 0 or not paths or LAYER_OFFLOADING not in family.info.part_capabilities.get(part, ()):
        return _Offload()
    if config.part(part).weight_dtype is DataType.NFLOAT_4:
        return _Offload()  # bitsandbytes' 4-bit weights stay on the device (`memory/layer_offload.py`)
    pattern = re.compile(rf"^({'|'.join(re.escape(p) for p in paths)})\.(\d+)\.")
    sizes: dict[tuple[int, int], int] = {}
    pinned = 0.0  # the blocks' tensors in float32 elements, each rounded up as the pinned allocator takes it
    for name, count in info.get("tensors", ()):
        found = pattern.match(name)
        if found:
            key = (paths.index(found.group(1)), int(found.group(2)))
            sizes[key] = sizes.get(key, 0) + count
            pinned += 2 ** math.ceil(math.log2(max(count, 1) * 4)) / 4
    keys = sorted(sizes)
    blocks = [sizes[key] for key in keys]
    if len(blocks) < 2:
        return _Offload()
    total = sum(blocks)
    window = len(blocks) - min(len(blocks) - 1, round(fraction * len(blocks)))
    offloaded = total - _largest_window(blocks, window)
    moving = 1.0  # the share of a block's parameters that moves with it
    trained_offloaded = 0
    trained_pinned = 0.0
    if config.training_method is TrainingMethod.FINE_TUNE and total:
        # The trained layers are inside the blocks (the share the layer filter trains, taken evenly).
        share = min(trained, total) / total
        trained_share = int(offloaded * share)
        if config.optimizer.fused_back_pass:
            trained_offloaded = trained_share
            trained_pinned = pinned * share  # every block leaves the device in turn: each keeps its state's home
        else:
            offloaded -= trained_share
            moving = 1.0 - share
    if not offloaded:  # nothing moves (every weight of the blocks trains and stays)
        return _Offload()
    named = tuple((f"{paths[path]}.{index}", int(size * moving)) for (path, index), size in zip(keys, blocks))
    return _Offload(offloaded, trained_offloaded, named, window, trained_pinned)


def _block_sizes(family: Family, part: str, info: dict) -> dict[tuple[int, int], int]:
    """The parameters of each of the part's declared blocks (`Family.layer_blocks`), keyed (list, index) in execution
    order, from the part's tensors."""
    import re

    paths = family.layer_blocks.get(part, ())
    if not paths:
        return {}
    pattern = re.compile(rf"^({'|'.join(re.escape(p) for p in paths)})\.(\d+)\.")
    sizes: dict[tuple[int, int], int] = {}
    for name, count in info.get("tensors", ()):
        found = pattern.match(name)
        if found:
            key = (paths.index(found.group(1)), int(found.group(2)))
            sizes[key] = sizes.get(key, 0) + count
    return sizes


def _split_blocks(
    config: TrainConfig, family: Family, part: str, info: dict, layers: list[tuple[str, int, int, int]]
) -> tuple[tuple[str, int, int], ...]:
    """A LoRA denoiser's declared blocks in execution order, each as (its name, its parameters, the adapter
    parameters of the adapted `layers` inside it), for a model split (`PartCount.split_blocks`)."""
    import re

    sizes = _block_sizes(family, part, info)
    if len(sizes) < 2:
        return ()
    paths = family.layer_blocks[part]
    pattern = re.compile(rf"^({'|'.join(re.escape(p) for p in paths)})\.(\d+)\.")
    inside: dict[tuple[int, int], list] = {}
    for layer in layers:
        found = pattern.match(layer[0])
        if found:
            inside.setdefault((paths.index(found.group(1)), int(found.group(2))), []).append(layer)
    out = []
    for path, index in sorted(sizes):
        adapters = _adapter_params(config, inside.get((path, index), []), True, "")
        out.append((f"{paths[path]}.{index}", sizes[(path, index)], adapters))
    return tuple(out)


def _largest_block(family: Family, part: str, info: dict) -> int:
    return max(_block_sizes(family, part, info).values(), default=0)


def _adapter_params(config: TrainConfig, layers: list[tuple[str, int, int, int]], denoiser: bool, blocks: str) -> int:
    """Adapter parameters over the layers the LoRA tab adapts (Linear: k = 1; Conv2d: k = kernel area); a text
    encoder's in the blocks its family adapts (`blocks`, the family's `text_encoder_blocks`)."""
    import re

    from onetrainer.config.enums import PeftType

    pattern = re.compile(blocks)
    total = 0
    for name, fan_in, fan_out, k in layers:
        if not denoiser and not pattern.search(name):
            continue
        lora = config.lora_rank * (fan_in * k + fan_out)
        if config.peft_type is PeftType.LOHA:
            total += 2 * lora
        elif config.peft_type is PeftType.LOKR:
            total += config.lokr_dim * (fan_in * k + fan_out) // 4
        elif config.peft_type is PeftType.OFT_2:
            size = config.oft_block_size
            total += (fan_in * k // max(size, 1)) * size * (size - 1) // 2
        else:
            total += lora + (fan_in if config.lora_decompose else 0)
    return total


# -- the counts ------------------------------------------------------------------------------------------------------

# part -> {"params": int, "layers": [(name, fan_in, fan_out, kernel area)], "tensors": [(name, numel)], "kept": names
# of the layers its class keeps out of low precision (transformers' `_keep_in_fp32_modules`)}
Shapes = dict[str, dict]


def safetensors_header(path: Path) -> dict[str, dict]:
    """The tensors of a .safetensors file (name → {"dtype", "shape", …}) from its header alone: no weights read."""
    from onetrainer.weights.checkpoint_files import read_safetensors_header

    header = read_safetensors_header(path)
    header.pop("__metadata__", None)
    return header


def _add(shapes: Shapes, part: str, name: str, shape: list[int]) -> None:
    entry = shapes.setdefault(part, {"params": 0, "layers": [], "tensors": []})
    count = 1
    for size in shape:
        count *= size
    entry["params"] += count
    entry["tensors"].append((name, count))
    if name.endswith(".weight") and len(shape) in (2, 4):  # a Linear's (out, in) or a Conv2d's (out, in, kh, kw)
        area = shape[2] * shape[3] if len(shape) == 4 else 1
        entry["layers"].append((name[: -len(".weight")], shape[1], shape[0], area))


def folder_shapes(folder: Path, parts: tuple[str, ...]) -> Shapes:
    """The counts of a diffusers model folder: each part's subfolder's safetensors files (shards included)."""
    shapes: Shapes = {}
    for part in parts:
        stored = 0  # the files' tensor bytes
        for file in sorted((folder / part).glob("*.safetensors")):
            for name, info in safetensors_header(file).items():
                _add(shapes, part, name, info["shape"])
                start, end = info.get("data_offsets", (0, 0))
                stored += end - start
        if part in shapes:
            config = _part_config(folder / part / "config.json")
            shapes[part]["kept"] = _kept_layers(config)
            if _read_as_stored(config):
                shapes[part]["stored_bytes"] = stored / max(shapes[part]["params"], 1)
    return shapes


def _part_config(config_file: Path) -> dict:
    import json

    try:
        data = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _read_as_stored(config: dict) -> bool:
    """Whether a part is read as its files store it rather than in its load dtype: a transformers model whose config
    names no dtype (`families/loading.read_pretrained`)."""
    return "architectures" in config and not (config.get("dtype") or config.get("torch_dtype"))


def _kept_layers(data: dict) -> list[str]:
    """The layers a part's class keeps out of low precision, from its config's class name (a transformers model's
    `architectures`, a diffusers model's `_class_name`)."""
    names = [*(data.get("architectures") or []), data.get("_class_name") or ""]
    for library in ("transformers", "diffusers"):
        module = __import__(library)
        for name in names:
            cls = getattr(module, name, None) if name else None
            if cls is not None:
                return list(getattr(cls, "_keep_in_fp32_modules", None) or [])
    return []


def module_shapes(module: torch.nn.Module) -> dict:
    """The counts of a built module (on the meta device: shapes only)."""
    import torch

    layers = []
    for name, layer in module.named_modules():
        if isinstance(layer, torch.nn.Linear):
            layers.append((name, layer.in_features, layer.out_features, 1))
        elif isinstance(layer, torch.nn.Conv2d):
            # a grouped convolution's weight reads in_channels / groups per output, as a file's weight shape says
            fan_in = layer.in_channels // layer.groups
            layers.append((name, fan_in, layer.out_channels, layer.kernel_size[0] * layer.kernel_size[1]))
    tensors = [(name, p.numel()) for name, p in module.named_parameters()]
    kept = list(getattr(module, "_keep_in_fp32_modules", None) or [])
    params = sum(count for _, count in tensors)
    return {"params": params, "layers": layers, "tensors": tensors, "kept": kept}


@lru_cache(maxsize=16)
def reference_shapes(model_type: Any, base_model_name: str = "") -> Shapes:
    """The counts of the released full-size model of a type (`families/meta_models.RELEASED_PARTS`, the variant the
    base model's name says, built on the meta device: no memory, no download)."""
    import torch

    from onetrainer.families.meta_models import instantiate, released_parts

    shapes: Shapes = {}
    with torch.device("meta"):
        for part, config in released_parts(model_type, base_model_name).items():
            _stop_if_cancelled()
            shapes[part] = module_shapes(instantiate(config))
    return shapes


def _model_folder(config: TrainConfig) -> Path | None:
    """The base model's diffusers folder: a local one (a registered source's model included, built on demand) or a
    hub snapshot in the cache."""
    from onetrainer.families.sources import resolve_local

    name = config.base_model_name.strip()
    try:
        local = resolve_local(name)
    except Exception:  # a name its source does not know: the checks say so
        local = Path(name)
    probes = ("model_index.json", f"{family_of(config).denoiser_part}/config.json")
    return local if local.is_dir() else _cached_snapshot(name, config.huggingface_cache_dir or None, probes)


def model_shapes(config: TrainConfig) -> tuple[Shapes, str]:
    """The parameter counts of the config's base model and where they come from: its files' safetensors headers
    (a registered source's model, a diffusers folder, a hub model in the local cache), else — a hub model not
    downloaded yet, a single file, a backup — the released model of its type."""
    from onetrainer.config.model_types import model_type_info

    family = family_of(config)
    name = config.base_model_name.strip()
    folder = _model_folder(config)
    if folder is not None:
        shapes = folder_shapes(folder, family.info.parts)
        if family.denoiser_part in shapes:
            return shapes, f"the files of {name}"
    label = model_type_info(config.model_type).label
    released = f"the released {label} model (the base model's files are not local)"
    return reference_shapes(config.model_type, name), released


def _cached_snapshot(name: str, cache_dir: str | None, probes: tuple[str, ...]) -> Path | None:
    """The snapshot folder of a hub model in the local cache, or None (without asking the hub)."""
    from onetrainer.families.sources import is_hub_id

    if not is_hub_id(name):
        return None
    try:
        from huggingface_hub import try_to_load_from_cache

        from onetrainer.util.hub import cache_folder

        for probe in probes:  # a pipeline's index, or the denoiser's folder of a part-wise model
            found = try_to_load_from_cache(name, probe, cache_dir=str(cache_folder(cache_dir)))
            if isinstance(found, str):
                return Path(found).parents[probe.count("/")]
    except Exception:  # a damaged cache: the reference counts serve
        return None
    return None


# -- the activations, measured on the meta device --------------------------------------------------------------------


def part_configs(config: TrainConfig) -> tuple[dict[str, dict], str]:
    """The config of each part of the model to be trained: the `config.json` in the part's folder of the base model
    (local or in the hub cache), else the released model's (a part without a config file of its own, a model not
    downloaded, a single file)."""
    import json

    from onetrainer.families.meta_models import released_parts

    family = family_of(config)
    try:
        configs = dict(released_parts(config.model_type, config.base_model_name))
    except ValueError:
        configs = {}
    source = "released"
    folder = _model_folder(config)
    if folder is not None:
        for part in family.info.parts:
            file = folder / part / "config.json"
            if file.is_file():
                configs[part] = json.loads(file.read_text())
                source = "files"
    return configs, source


def meta_model(config: TrainConfig, configs: dict[str, dict], dtype: torch.dtype, mode: Any) -> LoadedModel:
    """The parts a training step runs (the family's denoiser, text encoders and image encoders), built from their
    configs on the meta device and handed over as fake CPU tensors of `mode` (a `FakeTensorMode`): shapes and dtypes,
    no memory, and a device type the families' own code can open an autocast on. The denoiser is in the training
    dtype and trains (every parameter wants a gradient, so autograd keeps what a fine-tune keeps; a LoRA keeps the
    same inputs for its adapters). The text encoders get stand-in tokenizers that give `max_length` token ids."""
    import torch

    from onetrainer.families.base import LoadedModel, PartRole, TextEncoderSlot
    from onetrainer.families.meta_models import instantiate

    family = family_of(config)
    parts = {}
    with torch.device("meta"):
        for part, role in family.part_roles.items():
            if role is not PartRole.SAMPLING and part in configs:
                _stop_if_cancelled()
                parts[part] = instantiate(configs[part]).eval().requires_grad_(False)
    parts[family.denoiser_part] = parts[family.denoiser_part].to(dtype).train().requires_grad_(True)
    for module in parts.values():
        _to_fake(module, mode)
    slots = [
        TextEncoderSlot(part, parts[part], _StandInTokenizer(_text_length(parts[part])), "", "")
        for part, role in family.part_roles.items()
        if role is PartRole.TEXT_ENCODER and part in parts
    ]
    return LoadedModel(config.model_type, parts, slots, schedule=None, source=config.base_model_name)  # type: ignore[arg-type]


def _to_fake(module: torch.nn.Module, mode: Any) -> None:
    """The module's meta parameters and buffers as fake CPU tensors of `mode` (tied weights stay tied)."""
    import torch

    cpu = torch.device("cpu")
    converted: dict[int, torch.Tensor] = {}

    def fake(tensor: torch.Tensor) -> torch.Tensor:
        if id(tensor) not in converted:
            converted[id(tensor)] = mode.fake_tensor_converter.from_meta_and_device(mode, tensor, cpu)
        return converted[id(tensor)]

    parameters: dict[int, torch.nn.Parameter] = {}
    for layer in module.modules():
        for name, value in list(layer._parameters.items()):
            if value is not None:
                if id(value) not in parameters:
                    parameters[id(value)] = torch.nn.Parameter(fake(value), requires_grad=value.requires_grad)
                layer._parameters[name] = parameters[id(value)]
        for name, value in list(layer._buffers.items()):
            if value is not None:
                layer._buffers[name] = fake(value)


def _text_length(encoder: torch.nn.Module) -> int:
    # CLIP's context; encoders with relative positions have no fixed one: a caption of the same length.
    return int(getattr(encoder.config, "max_position_embeddings", 0) or 77)


class _StandInTokenizer:
    """What the families ask of a tokenizer, with token ids of the requested length (all zeros: shapes are what
    counts on the meta device)."""

    def __init__(self, length: int) -> None:
        self.model_max_length = length

    def __call__(self, captions: list[str], max_length: int | None = None, **_options: Any) -> Any:
        from types import SimpleNamespace

        import torch

        length = max_length or self.model_max_length
        ids = torch.zeros(len(captions), length, dtype=torch.long)
        return SimpleNamespace(input_ids=ids, attention_mask=torch.ones_like(ids))

    def apply_chat_template(self, messages: list[dict], **_options: Any) -> str:
        """A language-model encoder's prompt (the family pads it to its own length): the messages' text."""
        return " ".join(str(message.get("content", "")) for message in messages)


def _plain_conditioning(model: LoadedModel, count: int) -> Any:
    """Text conditioning without the family's `encode_text` (which may need state only loading gives): every text
    encoder's last hidden states side by side, the last one's pooled output, a full attention mask."""
    import torch

    from onetrainer.families.base import Conditioning

    hidden, pooled, length = [], None, 0
    for slot in model.text_encoders:
        length = slot.tokenizer.model_max_length
        output = slot.encoder(torch.zeros(count, length, dtype=torch.long))
        hidden.append(output.last_hidden_state)
        for name in ("text_embeds", "pooler_output"):
            if getattr(output, name, None) is not None:
                pooled = getattr(output, name)
                break
    tensors = {"hidden_states": torch.cat(hidden, dim=-1), "attention_mask": torch.ones(count, length)}
    if pooled is not None:
        tensors["pooled"] = pooled
    return Conditioning(tensors)


class _Tally:
    """The bytes of the tensors autograd saves for backward, each storage once; the parameters are weights, not
    activations."""

    def __init__(self, exclude: set[int]) -> None:
        self.exclude = exclude
        self.seen: dict[int, int] = {}

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        key = storage._cdata
        if key not in self.exclude and key not in self.seen:
            self.seen[key] = storage.nbytes()
        return tensor

    @property
    def total(self) -> float:
        return float(sum(self.seen.values()))


def _efficient_attention() -> Any:
    """A torch-function mode that runs `scaled_dot_product_attention` as the memory-efficient kernel a GPU trains with
    (it keeps the inputs, the output and the log-sum-exp for the backward pass); on the meta device torch would
    otherwise decompose it and keep the full attention matrix, which no GPU step holds."""
    import torch
    import torch.nn.functional as F
    from torch.overrides import TorchFunctionMode

    class EfficientAttention(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is not F.scaled_dot_product_attention:
                return func(*args, **kwargs)
            # positional or by keyword (diffusers' attention dispatch passes query=, key=, value=, attn_mask=)
            given = {**dict(zip(("query", "key", "value", "attn_mask"), args)), **kwargs}
            query, key, value = given["query"], given["key"], given["value"]
            mask = given.get("attn_mask")
            if mask is not None and mask.dtype == torch.bool:  # the kernel takes an additive bias
                mask = torch.zeros(mask.shape, dtype=query.dtype, device=query.device)
            if mask is not None:
                mask = mask.to(query.dtype).expand(*query.shape[:-2], query.shape[-2], key.shape[-2])
            output, *_ = torch.ops.aten._scaled_dot_product_efficient_attention(query, key, value, mask, True)
            return output

    return EfficientAttention()


def _training_inputs(
    family: Family, model: LoadedModel, height: int, width: int, references: bool, frames: int = 0
) -> tuple:
    """One sample's denoiser inputs as the trainer makes them (fake tensors, under the model's `FakeTensorMode`):
    latents of an image of the run's size (`encode_images`; a video family's: of a clip of `frames` frames), the text
    conditioning (`encode_text`), the batch extras (`batch_extras`, with one typical reference where `references`: the
    run trains on reference images)."""
    import torch
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    from onetrainer.families.base import BatchInputs

    with torch.no_grad():
        pixels = torch.zeros(1, 3, frames, height, width) if frames else torch.zeros(1, 3, height, width)
        latents = family.encode_images(model, pixels).float()
        try:
            conditioning = family.encode_text(model, [""])
        except Exception:  # the family's encoding needs state a meta model lacks (e.g. its caption length)
            conditioning = _plain_conditioning(model, 1)
        sizes, no = [(height, width)], torch.zeros(1, dtype=torch.bool)
        try:
            with unset_fake_temporarily():  # real tensors, whose grids the family reads as numbers
                references = family.typical_references(model) if references else {}
                if references:  # the extras of cached references (the model is not needed for them)
                    extra = family.batch_extras(model, BatchInputs(torch.zeros(latents.shape), None, sizes, [(0, 0)],
                                                                   None, no, cached=references))  # fmt: skip
            if not references:
                extra = family.batch_extras(model, BatchInputs(latents, None, sizes, [(0, 0)], None, no))
        except Exception:
            extra = {}
    return latents, torch.zeros(1), conditioning, extra


class _Measurement:
    """One training forward of the denoiser on the meta device, with gradient checkpointing switched on where the
    denoiser has it, so that one pass gives both figures: without checkpointing autograd would keep everything saved
    (`kept`); with it, what is saved outside the checkpointed blocks, every block's inputs, and the largest block's
    own saved tensors, recomputed in the backward pass one block at a time (`checkpointed`). Each block is noted in
    order too (`calls`: its name in the denoiser, from `names`, the bytes its inputs add to those kept, its own saved
    tensors), for where in the passes the activations are held (`_offloaded_step`)."""

    def __init__(self, params: set[int], names: dict[int, str] | None = None) -> None:
        self.params = params
        self.names = names or {}
        self.everything = _Tally(params)
        self.outside = _Tally(params)
        self.block_inputs = _Tally(params)
        self.largest_block = 0.0
        self.blocks = 0
        self.calls: list[tuple[str, float, float]] = []

    def pack_outside(self, tensor: torch.Tensor) -> torch.Tensor:
        self.everything.pack(tensor)
        return self.outside.pack(tensor)

    def block(self, function, *args, **kwargs):
        """Stands in for the checkpoint function the denoiser calls on each of its blocks: runs the block as it is
        and notes what checkpointing would keep of it."""
        import torch

        self.blocks += 1
        before = self.block_inputs.total
        for value in (*args, *kwargs.values()):
            if isinstance(value, torch.Tensor):
                self.block_inputs.pack(value)
        inner = _Tally(self.params)

        def pack(tensor: torch.Tensor) -> torch.Tensor:
            self.everything.pack(tensor)
            return inner.pack(tensor)

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            output = function(*args, **kwargs)
        self.largest_block = max(self.largest_block, inner.total)
        name = self.names.get(id(getattr(function, "__self__", function)), "")  # a block, or its bound forward
        self.calls.append((name, self.block_inputs.total - before, inner.total))
        return output

    @property
    def checkpointed(self) -> float:
        if not self.blocks:  # nothing checkpointed: the trainer cannot turn it on for this denoiser either
            return self.everything.total
        return self.outside.total + self.block_inputs.total + self.largest_block


def _forward(family: Family, model: LoadedModel, inputs: tuple, params: set[int]) -> tuple[_Measurement, float]:
    """The family's training forward on the meta device, measured; its FLOPs."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    latents, times, conditioning, extra = inputs
    denoiser = model.part(family.denoiser_part)
    names = {}
    for name, module in denoiser.named_modules():
        module.register_forward_pre_hook(_stop_if_cancelled)
        names[id(module)] = name
    for attempt in (extra, {}):  # without the extras where one needs state a meta model lacks (a loss's schedule)
        measurement = _Measurement(params, names)
        counter = FlopCounterMode(display=False)
        # A denoiser without the switch is measured without checkpointing, as the trainer would train it.
        with contextlib.suppress(AttributeError, TypeError, ValueError):
            denoiser.enable_gradient_checkpointing(gradient_checkpointing_func=measurement.block)
        try:
            with (
                torch.autograd.graph.saved_tensors_hooks(measurement.pack_outside, lambda t: t),
                counter,
                _efficient_attention(),
            ):
                family.predict(model, latents, times, conditioning, attempt)
            return measurement, float(counter.get_total_flops())
        except EstimateCancelled:
            raise
        except Exception:
            if not attempt:
                raise
        finally:
            if hasattr(denoiser, "disable_gradient_checkpointing"):
                denoiser.disable_gradient_checkpointing()
    raise AssertionError("unreachable")


@lru_cache(maxsize=8)
def _measured(
    config_key: str, height: int, width: int, dtype_name: str, references: bool, frames: int = 0
) -> Activations:
    """`measure_activations` for one model and size (cached: the GUI re-estimates after every edit)."""
    import json

    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from onetrainer.config import config_from_dict

    config, _ = config_from_dict(json.loads(config_key))
    family = family_of(config)
    configs, _source = part_configs(config)
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    model = meta_model(config, configs, getattr(torch, dtype_name), mode)
    params = {p.untyped_storage()._cdata for module in model.parts.values() for p in module.parameters()}
    with mode:
        inputs = _training_inputs(family, model, height, width, references, frames)
        measurement, flops = _forward(family, model, inputs, params)
    tokens = inputs[0].shape[-2] * inputs[0].shape[-1] * (inputs[0].shape[-3] if inputs[0].dim() == 5 else 1)
    with_reference = " and one reference's" if references else ""
    source = f"measured on the denoiser's forward ({tokens} latent tokens per sample{with_reference})"
    return Activations(
        measurement.everything.total * PEAK_FACTOR,
        measurement.checkpointed * PEAK_FACTOR,
        flops,
        source,
        measurement.block_inputs.total * PEAK_FACTOR if measurement.blocks else 0.0,
        family.denoiser_part,
        measurement.outside.total * PEAK_FACTOR,
        tuple((name, added * PEAK_FACTOR, own * PEAK_FACTOR) for name, added, own in measurement.calls),
    )


def trains_on_references(config: TrainConfig) -> bool:
    """Whether the run's samples carry reference images, as the estimate counts them: always where the model type
    needs them (an edit-only model), and where they are optional (a model that also generates) when an enabled
    concept's first image that trains has any (a preset, with no concepts yet, counts none)."""
    from onetrainer.data.images import reference_paths_of
    from onetrainer.data.scan import first_usable_image, reference_rule

    rule = reference_rule(config)
    if rule is None or rule.required:
        return rule is not None
    for concept in config.concepts or []:
        if not concept.enabled or not concept.path.strip():
            continue
        found = first_usable_image(Path(concept.path).expanduser(), concept.include_subdirectories, rule)
        if found.image is not None and reference_paths_of(found.image):
            return True
    return False


def clip_frames(config: TrainConfig) -> tuple[int, int]:
    """A video family's frames per training clip (the run's `frames`, rounded down to a count its VAE takes) and the
    latent frames they make (the first frame alone, then one per `step`); (0, 1) for an image family."""
    from onetrainer.data.scan import run_frames

    counts = family_of(config).info.video
    if counts is None:
        return 0, 1
    try:
        frames = max(counts.smallest, counts.at_most(run_frames(config)))
    except ValueError:  # not a count: the checks name it
        frames = counts.smallest
    return frames, 1 + (frames - counts.offset) // counts.step


def measure_activations(config: TrainConfig, shapes: Shapes) -> Activations:
    """One sample's activations and forward FLOPs at the run's resolution in the training dtype: measured on the
    family's own training step on the meta device, else (a step that cannot run there) the per-parameter rule."""
    import json

    from onetrainer.config.resolution import parse_resolution

    resolution = parse_resolution(config.resolution)
    width, height = resolution.exact or (resolution.largest, resolution.largest)
    frames, latent_frames = clip_frames(config)
    dtype = {2.0: "float16" if config.train_dtype is DataType.FLOAT_16 else "bfloat16"}.get(
        BYTES.get(config.train_dtype, 4.0), "float32"
    )
    # What decides the model and its configs: the base model, its type, the cache folder.
    key = json.dumps({
        "model_type": config.model_type.value, "base_model_name": config.base_model_name,
        "huggingface_cache_dir": config.huggingface_cache_dir,
    }, sort_keys=True)  # fmt: skip
    try:
        measured = _measured(key, height, width, dtype, trains_on_references(config), frames)
        stepping = stepping_denoiser(config)
        if measured.part and measured.part != stepping:  # an expert of the same shape runs this run's steps
            measured = replace(measured, part=stepping)
        return measured
    except EstimateCancelled:
        raise
    except Exception as error:  # the family's step does not run on the meta device
        params = shapes[family_of(config).denoiser_part]["params"]
        scale = BYTES.get(config.train_dtype, 4.0) / 2 * params**0.5 * width * height * latent_frames
        kept = RULE_ACTIVATIONS * scale * PEAK_FACTOR
        reason = f"{type(error).__name__}: {str(error)[:80]}"
        source = f"from a per-parameter rule (the family's step did not run on the meta device: {reason})"
        flops = RULE_FLOPS * params * width * height * latent_frames
        return Activations(kept, kept * RULE_CHECKPOINTED, flops, source)


def device_throughput(device: str) -> float | None:
    """Measured matmul FLOP/s of the device that will train (the CPU where `device` is missing), in 16-bit (CUDA) or
    32-bit (CPU), at a training-like efficiency."""
    import time

    import torch

    try:
        target = torch.device(device)
        if target.type != "cpu" and training_device_type(device) == "cpu":
            target = torch.device("cpu")
        dtype = torch.float16 if target.type == "cuda" else torch.float32
        n = 2048 if target.type == "cuda" else 512
        a = torch.randn(n, n, device=target, dtype=dtype)
        a @ a  # warm-up
        if target.type == "cuda":
            torch.cuda.synchronize(target)
        start = time.perf_counter()
        for _ in range(4):
            a @ a
        if target.type == "cuda":
            torch.cuda.synchronize(target)
        seconds = (time.perf_counter() - start) / 4
        return 0.5 * 2 * n**3 / seconds  # convolutions and attention run at about half a large matmul's rate
    except (RuntimeError, ValueError):
        return None


def free_memory(device: str) -> float | None:
    import torch

    target = torch.device(device)
    if target.type != "cuda" or not torch.cuda.is_available():
        return None
    free, _ = torch.cuda.mem_get_info(target)
    return float(free)


def estimate(
    config: TrainConfig,
    free_bytes: float | None = None,
    flops_per_second: float | None = None,
    cancelled: Callable[[], bool] | None = None,
    device: str | None = None,
    device_memory: float | None = None,
) -> Estimate:
    """The estimate for a config, with advice when it does not fit in `free_bytes`. Raises `EstimateCancelled` soon
    after `cancelled()` turns true. `device` ("cuda", "cpu"): the device type to estimate for, in place of the one
    that would train here (a preset's VRAM sized on a machine without a GPU). `device_memory`: each GPU's memory for a
    model split (`settings_of`)."""
    from onetrainer.util.threads import MODEL_LIBRARY_LOCK

    token = _CANCELLED.set(cancelled)
    try:
        # It imports and builds models on the app's worker thread while a run may load its own.
        with MODEL_LIBRARY_LOCK:
            _stop_if_cancelled()
            shapes, counted_from = model_shapes(config)
            counts = counts_of(config, shapes)
            _stop_if_cancelled()
            activations = measure_activations(config, shapes)
    finally:
        _CANCELLED.reset(token)
    settings = settings_of(config, activations, device_memory)
    if device is not None:
        settings = replace(settings, device=device)
    result = estimate_from_counts(counts, settings, flops_per_second)
    result.no_gpu = device is None and settings.device == "cpu" and not config.train_device.strip().startswith("cpu")
    result.free_bytes = free_bytes
    result.counted_from = counted_from
    result.activations_from = activations.source
    if free_bytes is not None and result.peak_bytes > free_bytes:
        result.advice = advice(counts, settings, free_bytes, flops_per_second, config, shapes)
    return result


def advice(
    counts: dict[str, PartCount],
    settings: Settings,
    free: float,
    flops,
    config: TrainConfig,
    shapes: Shapes | None = None,
) -> list[str]:
    """The single changes that bring the estimate under `free`, each with its new peak; else the best ones."""
    from onetrainer.config.model_types import LAYER_OFFLOADING
    from onetrainer.families.base import PartRole

    options = []
    family = family_of(config)
    roles = family.part_roles
    # Layer offloading for the parts on the device that can and do not yet (half their blocks in CPU memory).
    offloadable = [
        part
        for part, count in counts.items()
        if count.on_device
        and LAYER_OFFLOADING in family.info.part_capabilities.get(part, ())
        and config.part(part).offload_fraction == 0
        and config.part(part).weight_dtype is not DataType.NFLOAT_4
    ]
    if offloadable and shapes is not None:
        trial = config.copy()
        for part in offloadable:
            trial.part(part).offload_fraction = OFFLOAD_ADVICE
        changed = counts_of(trial, shapes)
        options.append((f"layer offload fraction {OFFLOAD_ADVICE} for " + ", ".join(offloadable), changed, settings))
    # FLOAT_8 for the frozen weights of the denoiser and the text encoders (image encoders stay as they are).
    frozen = {
        k: c
        for k, c in counts.items()
        if (roles.get(k) is PartRole.DENOISER or c.text_encoder)
        and c.on_device
        and BYTES[c.dtype] > 1
        and c.dtype not in GGUF_WEIGHT_DTYPES  # read quantized from its file: FLOAT_8 would need another file
    }
    if frozen and config.training_method is not TrainingMethod.FINE_TUNE:
        changed = {k: replace(c, dtype=DataType.FLOAT_8) if k in frozen else c for k, c in counts.items()}
        options.append(("FLOAT_8 weights for " + ", ".join(frozen), changed, settings))
    if not settings.gradient_checkpointing:
        options.append(("gradient checkpointing on", counts, replace(settings, gradient_checkpointing=True)))
    if settings.batch_size > 1:
        options.append(
            (f"batch size {settings.batch_size // 2}", counts, replace(settings, batch_size=settings.batch_size // 2))
        )
    text = {k: c for k, c in counts.items() if c.text_encoder and c.on_device and not c.trained}
    if text:
        changed = {k: replace(c, on_device=False) if k in text else c for k, c in counts.items()}
        options.append(
            ("cache the text encoders' outputs (latent caching on, text encoders not trained)", changed, settings)
        )
    if settings.optimizer_state_bytes > 2:
        options.append(("an 8-bit optimizer", counts, replace(settings, optimizer_state_bytes=2.0)))
    from onetrainer.training.fused_back_pass import FUSABLE_OPTIMIZERS

    fusable = config.optimizer.optimizer in FUSABLE_OPTIMIZERS and config.train_dtype is not DataType.FLOAT_16
    if settings.trains_in_place and not settings.fused_back_pass and fusable and not config.multi_gpu:
        trial = config.copy()
        trial.optimizer.fused_back_pass = True
        changed = counts_of(trial, shapes) if shapes is not None else counts  # offloaded blocks then move whole
        options.append(("the fused back pass (optimizer settings)", changed, replace(settings, fused_back_pass=True)))
    results = [(label, estimate_from_counts(c, s, flops).peak_bytes) for label, c, s in options]
    fitting = [(label, peak) for label, peak in results if peak <= free]
    chosen = fitting or sorted(results, key=lambda r: r[1])[:3]
    return [f"{label}: {size_text(peak)}" for label, peak in chosen]
