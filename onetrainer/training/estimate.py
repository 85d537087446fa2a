"""An estimate of peak VRAM and time per step before Start, from parameter counts and the settings.

Memory = the parts' weights in their dtypes (a part that is not needed on the GPU while training — a frozen text
encoder whose outputs are cached, the VAE with cached latents — is left out) + the trained parameters, their
gradients and the optimizer's state + activations, which scale with batch × pixels and shrink with gradient
checkpointing + a fixed overhead (CUDA context, allocator slack). Time = the denoiser's training FLOPs per step
(forward + backward = 3 forwards, 4 with checkpointing's recomputation) over the device's measured matmul
throughput. The activation and FLOP constants are per family at its base resolution; `docs/benchmarks.md` states
how far the estimate is from measurements.

The arithmetic (`estimate_from_counts`) takes plain numbers so it is tested on known counts; `model_counts` gets
the counts of the full-size models by building them on the meta device (no memory, no download).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache
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
# Per family at its base resolution, batch 1, 16-bit: activation bytes kept for the backward pass (without / with
# gradient checkpointing) and the denoiser's forward FLOPs.
FAMILY_CONSTANTS = {
    "sd": {"resolution": 512, "activations": 3.2 * GIB, "checkpointed": 0.45 * GIB, "flops": 0.8e12},
    "sdxl": {"resolution": 1024, "activations": 12.0 * GIB, "checkpointed": 1.4 * GIB, "flops": 6.0e12},
}
OVERHEAD = 0.6 * GIB


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


@dataclass
class Estimate:
    peak_bytes: float
    step_seconds: float | None
    parts: dict[str, float] = field(default_factory=dict)  # what the peak is made of, in bytes
    advice: list[str] = field(default_factory=list)
    free_bytes: float | None = None

    @property
    def fits(self) -> bool | None:
        return None if self.free_bytes is None else self.peak_bytes <= self.free_bytes

    def text(self) -> str:
        peak = f"estimated peak VRAM {self.peak_bytes / GIB:.1f} GiB"
        if self.free_bytes is not None:
            peak += f" (free: {self.free_bytes / GIB:.1f} GiB)"
        step = f", about {self.step_seconds:.2f} s/step" if self.step_seconds is not None else ""
        lines = [peak + step]
        lines.append("  " + ", ".join(f"{k} {v / GIB:.2f} GiB" for k, v in self.parts.items()))
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
    scale = settings.batch_size * (settings.resolution / constants["resolution"]) ** 2 * settings.train_dtype_bytes / 2
    kept = constants["checkpointed"] if settings.gradient_checkpointing else constants["activations"]
    activations = kept * scale
    parts = {"weights": weights, "training state": trained_bytes, "activations": activations, "overhead": OVERHEAD}
    seconds = None
    if flops_per_second:
        passes = 4 if settings.gradient_checkpointing else 3
        flops = constants["flops"] * passes * settings.batch_size * (settings.resolution / constants["resolution"]) ** 2
        seconds = flops / flops_per_second
    return Estimate(sum(parts.values()), seconds, parts)


def optimizer_state_bytes(optimizer: Optimizer) -> float:
    name = optimizer.value
    for key, value in _STATE_BYTES.items():
        if key in name:
            return value
    return 8.0  # Adam-like: two fp32 moments


def settings_of(config: TrainConfig, family: str) -> Settings:
    from onetrainer.config.resolution import parse_resolution

    denoiser = "unet"
    train_bytes = BYTES.get(config.train_dtype, 4.0)
    trained_dtype = config.lora_weight_dtype if config.training_method is TrainingMethod.LORA else DataType.FLOAT_32
    return Settings(
        family=family,
        batch_size=config.batch_size,
        resolution=parse_resolution(config.resolution).largest,
        gradient_checkpointing=bool(config.part(denoiser).gradient_checkpointing),
        train_dtype_bytes=train_bytes,
        trained_dtype_bytes=BYTES[trained_dtype],
        optimizer_state_bytes=optimizer_state_bytes(config.optimizer.optimizer),
    )


def counts_of(config: TrainConfig, shapes: dict[str, dict]) -> dict[str, PartCount]:
    """Per part: its size, dtype, whether it is on the device while stepping, and what trains on it."""
    counts = {}
    text_cached = config.latent_caching
    for part, info in shapes.items():
        part_config = config.part(part)
        train = bool(getattr(part_config, "train", False)) and part != "vae"
        if config.training_method is TrainingMethod.FINE_TUNE:
            trained = info["params"] if train else 0
        elif config.training_method is TrainingMethod.LORA and train:
            trained = _adapter_params(config, info["layers"], part == "unet")
        else:
            trained = 0
        on_device = part == "unet" or train or (part != "vae" and not text_cached)
        counts[part] = PartCount(info["params"], part_config.weight_dtype, on_device, trained)
    return counts


def _adapter_params(config: TrainConfig, layers: list[tuple[str, int, int, int]], denoiser: bool) -> int:
    """Adapter parameters over the layers the LoRA tab adapts (Linear: k = 1; Conv2d: k = kernel area)."""
    from onetrainer.config.enums import PeftType

    total = 0
    for name, fan_in, fan_out, k in layers:
        if not denoiser and ".layers." not in f".{name}":
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


@lru_cache(maxsize=8)
def model_shapes(model_type) -> dict[str, dict]:
    """Parameter counts and adaptable layer shapes of the full-size model, built on the meta device."""
    import torch

    from onetrainer.config.model_types import model_type_info
    from onetrainer.tiny import reference
    from onetrainer.tiny.components import instantiate

    family = model_type_info(model_type).family.key
    inpainting = model_type_info(model_type).inpainting
    if family == "sdxl":
        configs = {
            "unet": reference.SDXL_INPAINTING_UNET if inpainting else reference.SDXL_UNET,
            "text_encoder": reference.CLIP_L_TEXT,
            "text_encoder_2": reference.OPEN_CLIP_BIGG_TEXT,
            "vae": reference.SDXL_VAE,
        }
    else:
        configs = {
            "unet": reference.SD15_INPAINTING_UNET if inpainting else reference.SD15_UNET,
            "text_encoder": reference.CLIP_L_TEXT,
            "vae": reference.SD_VAE,
        }
    shapes = {}
    with torch.device("meta"):
        for part, config in configs.items():
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


def device_throughput(device: str) -> float | None:
    """Measured matmul FLOP/s of the device in 16-bit (CUDA) or 32-bit (CPU), at a training-like efficiency."""
    import time

    import torch

    try:
        target = torch.device(device)
        if target.type == "cuda" and not torch.cuda.is_available():
            return None
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

    family = model_type_info(config.model_type).family.key
    if family not in FAMILY_CONSTANTS:
        raise ValueError(f"no estimate for the {family} family yet")
    counts = counts_of(config, model_shapes(config.model_type))
    settings = settings_of(config, family)
    result = estimate_from_counts(counts, settings, flops_per_second)
    result.free_bytes = free_bytes
    if free_bytes is not None and result.peak_bytes > free_bytes:
        result.advice = advice(counts, settings, free_bytes, flops_per_second, config)
    return result


def advice(counts: dict[str, PartCount], settings: Settings, free: float, flops, config: TrainConfig) -> list[str]:
    """The single changes that bring the estimate under `free`, each with its new peak; else the best ones."""
    options = []
    frozen = {k: c for k, c in counts.items() if k != "vae" and c.on_device and BYTES[c.dtype] > 1}
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
    return [f"{label}: {peak / GIB:.1f} GiB" for label, peak in chosen]
