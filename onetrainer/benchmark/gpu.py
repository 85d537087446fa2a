"""A full-size UNet LoRA step on a GPU, as the low-VRAM recipes train it: it/s and peak VRAM.

Two cases, each a UNet of the real topology (`onetrainer/families/reference_configs.py`) with random weights, so
nothing is downloaded:

- "sd15": SD 1.5's UNet at 512 px (goal <= 2.5 GB; the low-VRAM recipe users follow today reports 2.8 GB);
- "sdxl": SDXL 1.0's UNet at 1024 px (goal <= 4.5 GB; OneTrainer users report 4.5-4.9 GB with fp8 weights at best,
  kohya's documentation gives 8 GB as the usual floor), as `presets/sdxl/lora-low-vram.json` trains it.

The recipe: fp16 base weights, fp32 LoRA weights (our default LoRA weight dtype) on the attention blocks (the
"attn-mlp" layer preset) at rank 16, fp16 autocast with a grad scaler, gradient checkpointing, batch 1, and cached
latents and text-encoder outputs (random tensors of the cached shapes: the VAE and the text encoders are not on the
GPU while training; for SDXL also the pooled embedding and the six size/crop numbers), with 8-bit AdamW where
bitsandbytes works and AdamW otherwise.

The same function runs on a CPU with a tiny UNet config, which is how the tests exercise it.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import asdict, dataclass

import torch

from onetrainer.benchmark.memory import GIB, PeakMemory, format_gib

TEXT_TOKENS = 77  # CLIP's context length: the shape of cached text embeddings


@dataclass(frozen=True)
class GpuCase:
    key: str
    label: str
    family_key: str  # whose layer presets name the adapted layers
    resolution: int
    goal_peak_bytes: int
    reference: str  # what users get today, for the report

    def unet_config(self) -> dict:
        from onetrainer.tiny import reference

        config = reference.SDXL_UNET if self.key == "sdxl" else reference.SD15_UNET
        return {k: v for k, v in config.items() if not k.startswith("_")}


CASES = {
    "sd15": GpuCase("sd15", "SD 1.5-size UNet LoRA", "sd", 512, int(2.5 * GIB), "the low-VRAM recipe reports 2.8 GB"),
    "sdxl": GpuCase(
        "sdxl", "SDXL-size UNet LoRA", "sdxl", 1024, int(4.5 * GIB), "OneTrainer users report 4.5-4.9 GB with fp8"
    ),
}


@dataclass(frozen=True)
class GpuRun:
    case: str
    device: str
    steps: int
    seconds: float
    peak_allocated_bytes: int | None  # None off CUDA
    peak_reserved_bytes: int | None
    optimizer: str
    weight_dtype: str
    resolution: int
    batch_size: int
    rank: int
    lora_targets: int
    trained_parameters: int
    gradient_checkpointing: bool

    @property
    def goal_peak_bytes(self) -> int:
        return CASES[self.case].goal_peak_bytes

    @property
    def steps_per_second(self) -> float:
        return self.steps / self.seconds if self.seconds > 0 else 0.0

    @property
    def goal_met(self) -> bool:
        return self.peak_allocated_bytes is not None and self.peak_allocated_bytes <= self.goal_peak_bytes

    def to_dict(self) -> dict:
        return {
            **asdict(self),
            "steps_per_second": self.steps_per_second,
            "goal_peak_bytes": self.goal_peak_bytes,
            "goal_met": self.goal_met,
        }


def unet_lora_benchmark(
    case: str,
    device: torch.device,
    steps: int = 20,
    warmup: int = 3,
    unet_config: dict | None = None,
    resolution: int | None = None,
    batch_size: int = 1,
    rank: int = 16,
    alpha: float = 1.0,
    layer_preset: str = "attn-mlp",
    weight_dtype: torch.dtype = torch.float16,
    gradient_checkpointing: bool = True,
    optimizer: str = "auto",
    float8_weights: bool = False,
) -> GpuRun:
    """Time `steps` LoRA steps after `warmup` ones; `optimizer` is "auto" (8-bit AdamW if it works), "adamw8bit"
    or "adamw"; `float8_weights` stores the UNet's Linear and Conv2d weights as float8 (FLOAT_8, computed in
    `weight_dtype`)."""
    from diffusers import UNet2DConditionModel
    from peft import LoraConfig

    from onetrainer.config.model_types import FAMILIES
    from onetrainer.noise.discrete import DiscreteSchedule
    from onetrainer.noise.prediction import PredictionType
    from onetrainer.precision.quantize import to_float8
    from onetrainer.tiny import reference
    from onetrainer.util.layer_filter import name_matches

    if steps < 1 or warmup < 1:
        raise ValueError("steps and warmup must be at least 1")
    spec = CASES[case]
    resolution = resolution or spec.resolution
    torch.manual_seed(0)
    config = {k: v for k, v in (unet_config or spec.unet_config()).items() if not k.startswith("_")}
    # Random init on the GPU is fast but holds the fp32 weights (3.4 GB for SD 1.5, 10 GB for SDXL) until the cast:
    # only where that fits easily; elsewhere initialise on the CPU and move the cast weights.
    roomy = device.type == "cuda" and torch.cuda.mem_get_info(device)[0] > 32 * GIB
    with torch.device(device if roomy else "cpu"):
        unet = UNet2DConditionModel.from_config(config)
    unet.to(device=device, dtype=weight_dtype)
    unet.requires_grad_(False)
    if float8_weights:
        to_float8(unet)  # before the adapters, as our loading quantizes a frozen part before the method

    patterns = list(FAMILIES[spec.family_key].layer_presets[layer_preset])
    adaptable = (torch.nn.Linear, torch.nn.Conv2d)
    targets = [n for n, m in unet.named_modules() if isinstance(m, adaptable) and name_matches(n, patterns, False)]
    unet.add_adapter(LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets, init_lora_weights=True))
    params = [p for n, p in unet.named_parameters() if "lora_" in n]
    for p in params:
        # Our LoRA weights train in FLOAT_32 by default (peft would otherwise follow the base layer's dtype).
        p.data = p.data.to(torch.float32)
        p.requires_grad_(True)
    if gradient_checkpointing:
        unet.enable_gradient_checkpointing()
    unet.train()

    opt, opt_name = _optimizer(params, 1e-4, device, optimizer)
    fp16_autocast = device.type == "cuda" and weight_dtype == torch.float16
    scaler = torch.amp.GradScaler("cuda") if fp16_autocast else None
    scheduler = DiscreteSchedule(reference.DDIM_EPSILON, PredictionType.EPSILON)
    size = resolution // 8  # the VAE's downscale
    latents = torch.randn(batch_size, config["in_channels"], size, size, device=device, dtype=weight_dtype)
    text = torch.randn(batch_size, TEXT_TOKENS, config["cross_attention_dim"], device=device, dtype=weight_dtype)
    added = _added_conditioning(config, batch_size, resolution, device, weight_dtype)

    times: list[float] = []
    with PeakMemory(device) as memory:
        for _ in range(warmup + steps):
            noise = torch.randn_like(latents)
            timesteps = torch.randint(0, scheduler.num_train_timesteps, (batch_size,), device=device)
            noisy = scheduler.add_noise(latents, noise, timesteps)
            context = torch.autocast("cuda", dtype=torch.float16) if fp16_autocast else contextlib.nullcontext()
            with context:
                prediction = unet(noisy, timesteps, text, added_cond_kwargs=added).sample
            loss = torch.nn.functional.mse_loss(prediction.float(), noise.float())
            if scaler is not None:
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
            else:
                loss.backward()
                opt.step()
            opt.zero_grad(set_to_none=True)
            loss.item()  # waits for the device, so the stamp marks the step's real end
            times.append(time.perf_counter())
    return GpuRun(
        case=case,
        device=_device_name(device),
        steps=steps,
        seconds=times[warmup + steps - 1] - times[warmup - 1],
        peak_allocated_bytes=memory.peak_bytes,
        peak_reserved_bytes=memory.reserved_bytes,
        optimizer=opt_name,
        weight_dtype=_dtype_name(weight_dtype, float8_weights),
        resolution=resolution,
        batch_size=batch_size,
        rank=rank,
        lora_targets=len(targets),
        trained_parameters=sum(p.numel() for p in params),
        gradient_checkpointing=gradient_checkpointing,
    )


def _dtype_name(dtype: torch.dtype, float8_weights: bool) -> str:
    name = str(dtype).removeprefix("torch.")
    return f"float8_e4m3fn ({name} compute)" if float8_weights else name


def format_gpu(run: GpuRun) -> str:
    case = CASES[run.case]
    reserved = f", {format_gib(run.peak_reserved_bytes)} reserved" if run.peak_reserved_bytes is not None else ""
    verdict = "met" if run.goal_met else "NOT met"
    checkpointing = "on" if run.gradient_checkpointing else "off"
    return "\n".join(
        [
            f"{case.label} on {run.device}: rank {run.rank} on {run.lora_targets} layers, "
            f"{run.weight_dtype} weights, gradient checkpointing {checkpointing}, "
            f"{run.resolution} px, batch {run.batch_size}, cached latents and text, {run.optimizer}",
            f"  {run.steps_per_second:.2f} it/s; peak VRAM {format_gib(run.peak_allocated_bytes)} allocated{reserved} "
            f"(goal <= {format_gib(run.goal_peak_bytes)}: {verdict}; {case.reference})",
        ]
    )


def _added_conditioning(config: dict, batch_size: int, resolution: int, device, dtype) -> dict | None:
    """SDXL's cached pooled text embedding and size/crop ids; None for UNets without added conditioning."""
    if config.get("addition_embed_type") != "text_time":
        return None
    pooled_dim = config["projection_class_embeddings_input_dim"] - 6 * config["addition_time_embed_dim"]
    pooled = torch.randn(batch_size, pooled_dim, device=device, dtype=dtype)
    ids = torch.tensor([[resolution, resolution, 0, 0, resolution, resolution]] * batch_size, device=device)
    return {"text_embeds": pooled, "time_ids": ids.to(dtype)}


def _optimizer(params: list[torch.nn.Parameter], lr: float, device: torch.device, choice: str):
    if choice in ("auto", "adamw8bit"):
        try:
            import bitsandbytes as bnb

            _probe_8bit(bnb, device)
            return bnb.optim.AdamW8bit(params, lr=lr, weight_decay=1e-2), "AdamW8bit (bitsandbytes)"
        except Exception as e:  # no bitsandbytes, or its kernels do not run here: fall back, and say so
            if choice == "adamw8bit":
                raise RuntimeError(f"bitsandbytes' AdamW8bit does not work here: {e}") from e
            reason = str(e).splitlines()[0][:120] if str(e) else type(e).__name__
            return torch.optim.AdamW(params, lr=lr, weight_decay=1e-2), f"AdamW (8-bit unavailable: {reason})"
    if choice == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=1e-2), "AdamW"
    if choice == "adafactor":  # as OneTrainer's fine-tune presets set it: a fixed rate, factored second moments
        from transformers.optimization import Adafactor

        adafactor = Adafactor(params, lr=lr, scale_parameter=False, relative_step=False, warmup_init=False)
        return adafactor, "Adafactor"
    raise ValueError(f"unknown optimizer choice {choice!r}: auto, adamw8bit, adamw or adafactor")


def _probe_8bit(bnb, device: torch.device) -> None:
    """One step on a throwaway tensor large enough for 8-bit state: an import can work while the kernels do not."""
    probe = torch.nn.Parameter(torch.zeros(8192, device=device))
    probe.grad = torch.ones_like(probe)
    bnb.optim.AdamW8bit([probe], lr=1e-3).step()


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return str(device)
