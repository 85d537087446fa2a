"""An estimate of peak memory and time per step before Start, from the model's own parameter counts and the settings.

Memory = the parts' weights (each part's parameter count × the bytes of its configured weight dtype; a part that is
not needed on the device while stepping — a frozen text encoder whose outputs are cached, the VAE with cached
latents, a decoder used only for samples — is left out) + the trained parameters, their gradients and the optimizer's
state + activations, which scale with batch × pixels, shrink with gradient checkpointing and grow with the denoiser's
width + on CUDA a fixed overhead (the CUDA context, allocator slack). Time = the denoiser's training FLOPs per step
(forward + backward = 3 forwards, 4 with checkpointing's recomputation) over the device's measured matmul
throughput. The activation and FLOP constants are per family, for its released denoiser at its base resolution,
and scale with the actual denoiser's size; `docs/benchmarks.md` states how far the estimate is from measurements.

The counts come from the model that will be trained (`model_shapes`): the safetensors headers of a local diffusers
folder or single file, of a `tiny:` model, or of a hub model in the local cache (no weights are read). Only a hub
model that is not downloaded yet is counted from its full-size reference config, built on the meta device (no
memory, no download). Where training runs on the CPU (no CUDA device), the estimate is of RAM and says so.

The arithmetic (`estimate_from_counts`) takes plain numbers so it is tested on known counts.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from onetrainer.config.enums import DataType, Optimizer, TrainingMethod

if TYPE_CHECKING:
    from onetrainer.config import TrainConfig

GIB = 1024**3
BYTES = {
    DataType.FLOAT_32: 4.0,
    DataType.TFLOAT_32: 4.0,
    DataType.FLOAT_16: 2.0,
    DataType.BFLOAT_16: 2.0,
    DataType.FLOAT_8: 1.0,
    DataType.NFLOAT_4: 0.5625,  # 4 bits plus a scale per 64 weights
}
# Optimizer state in bytes per trained parameter (fp32 states; 8-bit variants keep one byte per state).
_STATE_BYTES = {"8BIT": 2.0, "SGD": 4.0, "ADAFACTOR": 2.0, "LION": 4.0, "PRODIGY": 16.0, "DADAPT": 12.0}
# Per family, for the released denoiser (`params`) at its base resolution, batch 1, 16-bit: activation bytes kept for
# the backward pass (without / with gradient checkpointing) and the denoiser's forward FLOPs. SD and SDXL are
# measured; PixArt (28 DiT blocks over 64x64 tokens at 1024 px), Würstchen and Cascade (stage C over 24x24 latents)
# are derived from their shapes (FLOPs = 2 × parameters × tokens plus attention; activations ≈ 20 values of every
# block's token width kept per block).
FAMILY_CONSTANTS = {
    "sd": {"resolution": 512, "activations": 3.2 * GIB, "checkpointed": 0.45 * GIB, "flops": 0.8e12,
           "params": 859_520_964},
    "sdxl": {"resolution": 1024, "activations": 12.0 * GIB, "checkpointed": 1.4 * GIB, "flops": 6.0e12,
             "params": 2_567_463_684},
    "pixart": {"resolution": 1024, "activations": 5.3 * GIB, "checkpointed": 0.45 * GIB, "flops": 7.2e12,
               "params": 611_349_152},
    "wuerstchen": {"resolution": 1024, "activations": 1.4 * GIB, "checkpointed": 0.2 * GIB, "flops": 1.2e12,
                   "params": 993_636_896},
    "cascade": {"resolution": 1024, "activations": 2.0 * GIB, "checkpointed": 0.25 * GIB, "flops": 4.2e12,
                "params": 3_589_103_632},
}  # fmt: skip
OVERHEAD = 0.6 * GIB  # CUDA only: the context and the allocator's slack
MIB = 1024**2
# Parts that turn latents back into images: used for samples, not while stepping.
_SAMPLING_ONLY = ("decoder", "decoder_text_encoder", "decoder_vqgan")


@dataclass(frozen=True)
class PartCount:
    params: int
    dtype: DataType
    on_device: bool = True  # needed on the GPU during training steps
    trained: int = 0  # trained parameters of (or adapters on) this part


@dataclass(frozen=True)
class Settings:
    family: str
    batch_size: int
    resolution: int
    gradient_checkpointing: bool
    train_dtype_bytes: float
    trained_dtype_bytes: float
    optimizer_state_bytes: float
    # The denoiser's parameters over the released one's: activations grow with its width (the square root), FLOPs
    # with its size.
    size_ratio: float = 1.0
    device: str = "cuda"  # the device type that trains: "cuda" (VRAM), "cpu" (RAM), "mps"


def size_text(size: float) -> str:
    """Bytes for a reader: GiB from 1 GiB, else MiB (KiB below 1 MiB)."""
    if size >= GIB:
        return f"{size / GIB:.1f} GiB"
    if size >= MIB:
        return f"{size / MIB:.{0 if size >= 10 * MIB else 1}f} MiB"
    return f"{size / 1024:.0f} KiB"


@dataclass
class Estimate:
    peak_bytes: float
    step_seconds: float | None
    parts: dict[str, float] = field(default_factory=dict)  # what the peak is made of, in bytes
    advice: list[str] = field(default_factory=list)
    free_bytes: float | None = None
    device: str = "cuda"  # the device type that trains
    counted_from: str = ""  # where the parameter counts come from

    @property
    def fits(self) -> bool | None:
        return None if self.free_bytes is None else self.peak_bytes <= self.free_bytes

    @property
    def memory(self) -> str:
        """What memory the peak is of: VRAM on CUDA, the CPU's RAM without a GPU."""
        return {"cuda": "VRAM", "cpu": "CPU memory (RAM)"}.get(self.device, f"{self.device.upper()} memory")

    def summary(self) -> str:
        """One line beside Start: "≈ 5.1 GiB VRAM · 0.40 s/step", "≈ 12 MiB CPU memory (RAM) · 0.02 s/step"."""
        text = f"≈ {size_text(self.peak_bytes)} {self.memory}"
        if self.step_seconds is not None:
            text += f" · {self.step_seconds:.2f} s/step"
        return text

    def text(self) -> str:
        peak = f"estimated peak {self.memory} {size_text(self.peak_bytes)}"
        if self.free_bytes is not None:
            peak += f" (free: {size_text(self.free_bytes)})"
        if self.device == "cpu":
            peak += " (training on the CPU)"
        step = f", about {self.step_seconds:.2f} s/step" if self.step_seconds is not None else ""
        lines = [peak + step]
        lines.append("  " + ", ".join(f"{k} {size_text(v)}" for k, v in self.parts.items()))
        if self.counted_from:
            lines.append(f"  parameters counted from {self.counted_from}")
        if self.fits is False:
            lines.append("  does not fit; these bring it under:" if self.advice else "  does not fit")
            lines += [f"  - {a}" for a in self.advice]
        return "\n".join(lines)


def estimate_from_counts(
    counts: dict[str, PartCount], settings: Settings, flops_per_second: float | None = None
) -> Estimate:
    """Peak bytes and seconds per step from parameter counts (see the module docstring for the model)."""
    constants = FAMILY_CONSTANTS[settings.family]
    weights = sum(c.params * BYTES[c.dtype] for c in counts.values() if c.on_device)
    trained = sum(c.trained for c in counts.values())
    trained_bytes = trained * (2 * settings.trained_dtype_bytes + settings.optimizer_state_bytes)
    pixels = settings.batch_size * (settings.resolution / constants["resolution"]) ** 2
    scale = pixels * settings.train_dtype_bytes / 2 * settings.size_ratio**0.5
    kept = constants["checkpointed"] if settings.gradient_checkpointing else constants["activations"]
    activations = kept * scale
    parts = {"weights": weights, "training state": trained_bytes, "activations": activations}
    if settings.device == "cuda":
        parts["overhead"] = OVERHEAD
    seconds = None
    if flops_per_second:
        passes = 4 if settings.gradient_checkpointing else 3
        seconds = constants["flops"] * settings.size_ratio * passes * pixels / flops_per_second
    return Estimate(sum(parts.values()), seconds, parts, device=settings.device)


def optimizer_state_bytes(optimizer: Optimizer) -> float:
    name = optimizer.value
    for key, value in _STATE_BYTES.items():
        if key in name:
            return value
    return 8.0  # Adam-like: two fp32 moments


def training_device_type(name: str) -> str:
    """The device type that will train for a configured `train_device`: the CPU where CUDA (or MPS) is missing, as
    training falls back to it (`devices.select_device`)."""
    from onetrainer.training.devices import select_device

    try:
        return select_device(name, lambda _text: None).type
    except (RuntimeError, ValueError):  # not a device name: the config check reports it
        return "cpu"


def settings_of(config: TrainConfig, family: str, denoiser_params: int = 0) -> Settings:
    from onetrainer.config.model_types import model_type_info
    from onetrainer.config.resolution import parse_resolution

    denoiser = model_type_info(config.model_type).family.parts[0]
    train_bytes = BYTES.get(config.train_dtype, 4.0)
    trained_dtype = config.lora_weight_dtype if config.training_method is TrainingMethod.LORA else DataType.FLOAT_32
    reference = FAMILY_CONSTANTS[family]["params"]
    return Settings(
        family=family,
        batch_size=config.batch_size,
        resolution=parse_resolution(config.resolution).largest,
        gradient_checkpointing=bool(config.part(denoiser).gradient_checkpointing),
        train_dtype_bytes=train_bytes,
        trained_dtype_bytes=BYTES[trained_dtype],
        optimizer_state_bytes=optimizer_state_bytes(config.optimizer.optimizer),
        size_ratio=denoiser_params / reference if denoiser_params else 1.0,
        device=training_device_type(config.train_device),
    )


def counts_of(config: TrainConfig, shapes: dict[str, dict]) -> dict[str, PartCount]:
    """Per part: its size, dtype, whether it is on the device while stepping, and what trains on it."""
    from onetrainer.config.model_types import model_type_info

    denoiser = model_type_info(config.model_type).family.parts[0]
    cached = config.latent_caching
    counts = {}
    for part, info in shapes.items():
        part_config = config.part(part)
        text = part.startswith("text_encoder")
        train = bool(getattr(part_config, "train", False)) and (part == denoiser or text)
        if config.training_method is TrainingMethod.FINE_TUNE:
            trained = info["params"] if train else 0
        elif config.training_method is TrainingMethod.LORA and train:
            trained = _adapter_params(config, info["layers"], part == denoiser)
        else:
            trained = 0
        if part == denoiser or train:
            on_device = True
        elif part in _SAMPLING_ONLY:
            on_device = False
        else:  # text encoders and image encoders (VAE, EfficientNet) work every step unless their outputs are cached
            on_device = not cached
        counts[part] = PartCount(info["params"], part_config.weight_dtype, on_device, trained)
    return counts


def _adapter_params(config: TrainConfig, layers: list[tuple[str, int, int, int]], denoiser: bool) -> int:
    """Adapter parameters over the layers the LoRA tab adapts (Linear: k = 1; Conv2d: k = kernel area)."""
    import re

    from onetrainer.config.enums import PeftType
    from onetrainer.families.base import Family

    blocks = re.compile(Family.text_encoder_blocks)  # the text encoder layers a LoRA adapts (CLIP's and T5's)
    total = 0
    for name, fan_in, fan_out, k in layers:
        if not denoiser and not blocks.search(name):
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

Shapes = dict[str, dict]  # part -> {"params": int, "layers": [(name, fan_in, fan_out, kernel area)]}
# Single files (the original layouts): the key prefixes of the parts that are not the denoiser.
_SINGLE_FILE_PARTS = (
    ("first_stage_model.", "vae"),
    ("cond_stage_model.", "text_encoder"),
    ("conditioner.embedders.0.", "text_encoder"),
    ("conditioner.embedders.1.", "text_encoder_2"),
)
# A part's folder in a diffusers model where it differs from the part's name.
_FOLDERS = {"decoder_vqgan": "vqgan"}


def safetensors_header(path: Path) -> dict[str, dict]:
    """The tensors of a .safetensors file (name → {"dtype", "shape", …}) from its header alone: no weights read."""
    import json
    import struct

    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
    header.pop("__metadata__", None)
    return header


def _add(shapes: Shapes, part: str, name: str, shape: list[int]) -> None:
    entry = shapes.setdefault(part, {"params": 0, "layers": []})
    count = 1
    for size in shape:
        count *= size
    entry["params"] += count
    if name.endswith(".weight") and len(shape) in (2, 4):  # a Linear's (out, in) or a Conv2d's (out, in, kh, kw)
        area = shape[2] * shape[3] if len(shape) == 4 else 1
        entry["layers"].append((name[: -len(".weight")], shape[1], shape[0], area))


def folder_shapes(folder: Path, parts: tuple[str, ...]) -> Shapes:
    """The counts of a diffusers model folder: each part's subfolder's safetensors files (shards included)."""
    shapes: Shapes = {}
    for part in parts:
        for file in sorted((folder / _FOLDERS.get(part, part)).glob("*.safetensors")):
            for name, info in safetensors_header(file).items():
                _add(shapes, part, name, info["shape"])
    return shapes


def single_file_shapes(path: Path, denoiser: str) -> Shapes:
    """The counts of a single .safetensors checkpoint: known prefixes to their parts, the rest to the denoiser."""
    shapes: Shapes = {}
    for name, info in safetensors_header(path).items():
        part = next((p for prefix, p in _SINGLE_FILE_PARTS if name.startswith(prefix)), denoiser)
        _add(shapes, part, name, info["shape"])
    return shapes


@lru_cache(maxsize=16)
def reference_shapes(model_type) -> Shapes:
    """The counts of the released full-size model of a type (from the tiny models' reference configs, built on the
    meta device: no memory, no download)."""
    import torch

    from onetrainer.config.model_types import model_type_info
    from onetrainer.tiny import TINY_VARIANTS
    from onetrainer.tiny.components import instantiate

    parts = model_type_info(model_type).family.parts
    variants = [v for v in TINY_VARIANTS.values() if v.model_type.value == getattr(model_type, "value", model_type)]
    if not variants:
        raise ValueError(f"no reference model for {model_type}")
    references = {}
    for variant in variants:  # the prior's variant first, then its decoder's for the parts it adds
        for folder, config in variant.references.items():
            part = next((p for p in parts if _FOLDERS.get(p, p) == folder), None)
            is_model = isinstance(config, dict) and ("_class_name" in config or "architectures" in config)
            if part is not None and part not in references and is_model:  # not a tokenizer's or a scheduler's
                references[part] = config
    shapes: Shapes = {}
    with torch.device("meta"):
        for part, config in references.items():
            module = instantiate(config)
            layers = []
            for name, layer in module.named_modules():
                if isinstance(layer, torch.nn.Linear):
                    layers.append((name, layer.in_features, layer.out_features, 1))
                elif isinstance(layer, torch.nn.Conv2d):
                    area = layer.kernel_size[0] * layer.kernel_size[1]
                    layers.append((name, layer.in_channels, layer.out_channels, area))
            shapes[part] = {"params": sum(p.numel() for p in module.parameters()), "layers": layers}
    return shapes


def model_shapes(config: TrainConfig) -> tuple[Shapes, str]:
    """The parameter counts of the config's base model and where they come from: its files' safetensors headers
    (a `tiny:` model, a diffusers folder, a .safetensors file, a hub model in the local cache), else — a hub model not
    downloaded yet, a .ckpt, a backup — the released model of its type."""
    from onetrainer.config.model_types import model_type_info
    from onetrainer.tiny.source import resolve_local

    parts = model_type_info(config.model_type).family.parts
    name = config.base_model_name.strip()
    try:
        local = resolve_local(name)
    except Exception:  # an unknown tiny model: the checks say so
        local = Path(name)
    folder = local if local.is_dir() else _cached_snapshot(name, config.huggingface_cache_dir or None)
    if folder is not None:
        shapes = folder_shapes(folder, parts)
        if parts[0] in shapes:
            return shapes, f"the files of {name}"
    if local.is_file() and local.suffix.lower() == ".safetensors":
        try:
            return single_file_shapes(local, parts[0]), f"the file {name}"
        except (OSError, ValueError):
            pass
    label = model_type_info(config.model_type).label
    return reference_shapes(config.model_type), f"the released {label} model (the base model's files are not local)"


def _cached_snapshot(name: str, cache_dir: str | None) -> Path | None:
    """The snapshot folder of a hub model in the local cache, or None (without asking the hub)."""
    from onetrainer.families.sources import is_hub_id

    if not is_hub_id(name):
        return None
    try:
        from huggingface_hub import try_to_load_from_cache

        from onetrainer.util.hub import cache_folder

        for probe in ("model_index.json", "unet/config.json", "transformer/config.json", "prior/config.json"):
            found = try_to_load_from_cache(name, probe, cache_dir=str(cache_folder(cache_dir)))
            if isinstance(found, str):
                return Path(found).parent if "/" not in probe else Path(found).parent.parent
    except Exception:  # a damaged cache: the reference counts serve
        return None
    return None


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


def estimate(config: TrainConfig, free_bytes: float | None = None, flops_per_second: float | None = None) -> Estimate:
    """The estimate for a config, with advice when it does not fit in `free_bytes`."""
    from onetrainer.config.model_types import model_type_info

    family_info = model_type_info(config.model_type).family
    family = family_info.key
    if family not in FAMILY_CONSTANTS:
        raise ValueError(f"no estimate for the {family} family yet")
    shapes, counted_from = model_shapes(config)
    counts = counts_of(config, shapes)
    settings = settings_of(config, family, shapes[family_info.parts[0]]["params"])
    result = estimate_from_counts(counts, settings, flops_per_second)
    result.free_bytes = free_bytes
    result.counted_from = counted_from
    if free_bytes is not None and result.peak_bytes > free_bytes:
        result.advice = advice(counts, settings, free_bytes, flops_per_second, config)
    return result


def advice(counts: dict[str, PartCount], settings: Settings, free: float, flops, config: TrainConfig) -> list[str]:
    """The single changes that bring the estimate under `free`, each with its new peak; else the best ones."""
    options = []
    from onetrainer.config.model_types import model_type_info

    denoiser = model_type_info(config.model_type).family.parts[0]
    # FLOAT_8 for the frozen weights of the denoiser and the text encoders (image encoders stay as they are).
    frozen = {
        k: c
        for k, c in counts.items()
        if (k == denoiser or k.startswith("text_encoder")) and c.on_device and BYTES[c.dtype] > 1
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
    text = {k: c for k, c in counts.items() if k.startswith("text_encoder") and c.on_device and not c.trained}
    if text:
        changed = {k: replace(c, on_device=False) if k in text else c for k, c in counts.items()}
        options.append(
            ("cache the text encoders' outputs (latent caching on, text encoders not trained)", changed, settings)
        )
    if settings.optimizer_state_bytes > 2:
        options.append(("an 8-bit optimizer", counts, replace(settings, optimizer_state_bytes=2.0)))
    results = [(label, estimate_from_counts(c, s, flops).peak_bytes) for label, c, s in options]
    fitting = [(label, peak) for label, peak in results if peak <= free]
    chosen = fitting or sorted(results, key=lambda r: r[1])[:3]
    return [f"{label}: {size_text(peak)}" for label, peak in chosen]
