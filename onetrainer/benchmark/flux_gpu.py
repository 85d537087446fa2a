"""A full-size Flux.1 LoRA step on a GPU: it/s and peak VRAM.

The transformer is FLUX.1-dev's (the released config in `onetrainer/families/reference_configs.py`: 19 double- and
38 single-stream blocks of 24 heads of 128, 11.9 B parameters) with random weights, built on the GPU straight in the
weight dtype, so nothing is downloaded and no fp32 copy is ever held. The step is our Flux family's, at the settings
a Flux LoRA trains with:

- bfloat16 base weights (or FLOAT_8: stored as float8 through `precision/quantize.to_float8`, computed in bfloat16; or
  INT_8 / INT_W8A8 / FLOAT_W8A8 through `precision/quantize.to_scaled_8bit`), fp32 LoRA weights (our default LoRA weight
  dtype) at rank 16 on the family's `attn-mlp` layers, bfloat16 autocast (no grad scaler), gradient checkpointing,
  batch 1;
- 1024 px: 128×128 latents of 16 channels, packed 2×2 into 4096 image tokens with their (0, row, column) ids, and
  512 T5 tokens (cached T5-XXL hidden states and CLIP-L's pooled output as random tensors of those shapes: the text
  encoders and the VAE are not on the GPU while training), the guidance input at the training value 1.0;
- σ drawn logit-normally, x_t = (1 − σ)·x0 + σ·ε, the transformer called with timestep σ, MSE against ε − x0;
- 8-bit AdamW where bitsandbytes works, AdamW otherwise (as `gpu.py`);
- with `offload_fraction`, the trainer's layer offloading (`memory/layer_offload.py`) on the family's blocks, attached
  after the adapters as the trainer attaches it: that share of the blocks' frozen weights in pinned CPU memory, copied
  in ahead of use on a side stream (`async_copies`) or in line.

With `method="FINE_TUNE"` the whole transformer trains instead (bfloat16 weights, Adafactor as OneTrainer's fine-tune
presets set it), optionally with the fused back pass (`training/fused_back_pass.py`), which also lets the offloaded
blocks move with their trained weights and optimizer state.

The same function runs on a CPU with a tiny transformer config in float32, which is how the tests exercise it; the
benchmark's CLI reports the full-size case as not measured without CUDA.
"""

from __future__ import annotations

import contextlib
import gc
import time
from dataclasses import asdict, dataclass

import torch

from onetrainer.benchmark.memory import GIB, PeakMemory

RESOLUTION = 1024
TEXT_TOKENS = 512  # FLUX.1-dev's T5 prompt length
VAE_FACTOR = 8
LATENT_CHANNELS = 16
WEIGHT_DTYPES = ("BFLOAT_16", "FLOAT_8")
# `precision/quantize.to_scaled_8bit`'s kinds
SCALED_8BIT = ("INT_8", "INT_W8A8", "FLOAT_W8A8", "INT_W8A8_COMPRESSED", "FLOAT_W8A8_COMPRESSED")
LABEL = "Flux.1-dev-size transformer LoRA"


@dataclass(frozen=True)
class FluxGpuRun:
    device: str
    steps: int
    seconds: float
    peak_allocated_bytes: int | None  # None off CUDA
    peak_reserved_bytes: int | None
    weights_bytes: int  # the transformer's stored base weights (the LoRA's own not counted)
    base_parameters: int
    optimizer: str
    weight_dtype: str  # BFLOAT_16, FLOAT_8 (stored float8, computed in compute_dtype), an 8-bit kind, FLOAT_32 (CPU)
    compute_dtype: str
    resolution: int
    image_tokens: int
    text_tokens: int
    batch_size: int
    rank: int
    lora_targets: int
    trained_parameters: int
    gradient_checkpointing: bool
    losses_finite: bool
    attention: str  # the scaled-dot-product attention backends allowed
    offload_fraction: float = 0.0
    offloaded_blocks: int = 0  # of the transformer's blocks, off the device at a time
    blocks: int = 0  # the transformer's blocks (double- and single-stream)
    offload_host_bytes: int = 0  # the offloaded weights' CPU buffers
    page_locked_buffers: int = 0  # of those, page-locked in place
    attach_seconds: float = 0.0  # the offloader's attach: the weights copied out (and page-locked)
    async_copies: bool = False
    method: str = "LORA"  # or FINE_TUNE (the whole transformer)
    fused_back_pass: bool = False

    @property
    def steps_per_second(self) -> float:
        return self.steps / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict:
        return {**asdict(self), "steps_per_second": self.steps_per_second}


def full_transformer_config() -> dict:
    from onetrainer.families import reference_configs as ref

    return {k: v for k, v in ref.FLUX_DEV_TRANSFORMER.items() if not k.startswith("_")}


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype):
    """Modules built inside are initialised straight in `dtype` (no fp32 copy of 12 B parameters first)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def flux_lora_benchmark(
    device: torch.device,
    steps: int = 10,
    warmup: int = 2,
    transformer_config: dict | None = None,
    resolution: int = RESOLUTION,
    text_tokens: int = TEXT_TOKENS,
    batch_size: int = 1,
    rank: int = 16,
    alpha: float = 1.0,
    layer_preset: str = "attn-mlp",
    weight_dtype: str = "BFLOAT_16",
    gradient_checkpointing: bool = True,
    optimizer: str = "auto",
    offload_fraction: float = 0.0,
    async_copies: bool = True,
    method: str = "LORA",
    fused_back_pass: bool = False,
) -> FluxGpuRun:
    """Time `steps` LoRA steps after `warmup` ones. `weight_dtype`: BFLOAT_16, FLOAT_8 (float8 storage, bfloat16
    compute), INT_8 / INT_W8A8 / FLOAT_W8A8 (and the _COMPRESSED two, CUDA only) or FLOAT_32 (no autocast: the CPU
    test); `optimizer` as `gpu.unet_lora_benchmark`'s; `offload_fraction` > 0 offloads that share of the blocks as
    training does."""
    from diffusers import FluxTransformer2DModel
    from peft import LoraConfig, inject_adapter_in_model

    from onetrainer.benchmark.gpu import _device_name, _optimizer
    from onetrainer.config.enums import DataType
    from onetrainer.config.model_types import FAMILIES
    from onetrainer.families.flux import PATCH, FluxFamily, image_ids, pack, unpack
    from onetrainer.memory.layer_offload import LayerOffload
    from onetrainer.precision.quantize import to_float8, to_scaled_8bit
    from onetrainer.training.fused_back_pass import FusedBackPass
    from onetrainer.util.layer_filter import name_matches

    if steps < 1 or warmup < 1:
        raise ValueError("steps and warmup must be at least 1")
    known = (*WEIGHT_DTYPES, *SCALED_8BIT, "FLOAT_32")
    if weight_dtype not in known:
        raise ValueError(f"unknown weight dtype {weight_dtype!r}: {', '.join(known)}")
    if resolution % (VAE_FACTOR * PATCH):
        raise ValueError(f"the resolution must be a multiple of {VAE_FACTOR * PATCH} px")
    compute = torch.float32 if weight_dtype == "FLOAT_32" else torch.bfloat16
    config = transformer_config or full_transformer_config()
    config = {k: v for k, v in config.items() if not k.startswith("_")}
    torch.manual_seed(0)
    with torch.device(device), _default_dtype(compute):
        transformer = FluxTransformer2DModel.from_config(config)
    transformer.requires_grad_(False)
    # Before the adapters, as our loading quantizes a frozen part before the method.
    if weight_dtype == "FLOAT_8":
        to_float8(transformer)
    elif weight_dtype in SCALED_8BIT:
        codec = None
        if weight_dtype.endswith("_COMPRESSED"):
            from onetrainer.precision.weight_codecs import codec_for

            # A trained model's weights are mostly small (random initial ones are uniform, which no coder shrinks):
            # normal weights compress about as a trained model's do, or a little less.
            for module in transformer.modules():
                if isinstance(module, torch.nn.Linear):
                    module.weight.data.normal_(0.0, 0.02)
            codec = codec_for(device)
        to_scaled_8bit(transformer, DataType[weight_dtype], codec=codec)
    base_parameters = sum(p.numel() for p in transformer.parameters())
    weights_bytes = sum(p.numel() * p.element_size() for p in transformer.parameters())
    weights_bytes += sum(b.numel() * b.element_size() for n, b in transformer.named_buffers() if n.endswith("_scale"))

    fine_tune = method == "FINE_TUNE"
    if fine_tune:
        if weight_dtype not in ("BFLOAT_16", "FLOAT_32"):
            raise ValueError("a fine-tune trains BFLOAT_16 (or, on a CPU, FLOAT_32) weights")
        targets = []
        params = list(transformer.parameters())
        transformer.requires_grad_(True)
    else:
        patterns = list(FAMILIES["flux"].layer_presets[layer_preset])
        modules = transformer.named_modules()
        targets = [n for n, m in modules if isinstance(m, torch.nn.Linear) and name_matches(n, patterns, False)]
        inject_adapter_in_model(LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets), transformer)
        params = [p for n, p in transformer.named_parameters() if "lora_" in n]
        for p in params:
            # Our LoRA weights train in FLOAT_32 by default (peft would otherwise follow the base layer's dtype).
            p.data = p.data.to(device=device, dtype=torch.float32)
            p.requires_grad_(True)
    trained_parameters = sum(p.numel() for p in params)  # now: an offloaded weight is an empty stand-in
    if gradient_checkpointing:
        transformer.enable_gradient_checkpointing()
    transformer.train()
    offload, attach_seconds = None, 0.0
    if offload_fraction > 0:
        blocks = FluxFamily.layer_blocks["transformer"]
        trained = fine_tune and fused_back_pass  # the trainer's rule (`placement.offloaded_parts`)
        offload = LayerOffload(transformer, blocks, offload_fraction, async_copies, trained=trained)
        started = time.perf_counter()
        offload.attach(device)
        attach_seconds = time.perf_counter() - started
    if fine_tune and optimizer == "auto":
        optimizer = "adafactor"
    opt, opt_name = _optimizer(params, 1e-5 if fine_tune else 1e-4, device, optimizer)
    fused = FusedBackPass(opt) if fused_back_pass else None
    if offload is not None and offload.trained:
        offload.carry_optimizer_state(opt)

    size = resolution // VAE_FACTOR
    rows = size // PATCH
    generator = torch.Generator(device=device).manual_seed(0)
    latents = torch.randn(batch_size, LATENT_CHANNELS, size, size, device=device, generator=generator)
    text = torch.randn(batch_size, text_tokens, config["joint_attention_dim"], device=device, generator=generator)
    pooled = torch.randn(batch_size, config["pooled_projection_dim"], device=device, generator=generator)
    guidance = torch.ones(batch_size, device=device) if config.get("guidance_embeds") else None
    text_ids = torch.zeros(text_tokens, 3, device=device)
    autocast = torch.autocast(device.type, dtype=compute) if compute != torch.float32 else contextlib.nullcontext()

    times: list[float] = []
    finite = True
    backends, attention = _attention_backends(device)
    with backends, PeakMemory(device) as memory:
        for _ in range(warmup + steps):
            noise = torch.randn_like(latents)
            sigmas = torch.sigmoid(torch.randn(batch_size, device=device))  # logit-normal σ
            s = sigmas.view(-1, 1, 1, 1)
            noisy = (1.0 - s) * latents + s * noise
            with autocast:
                output = transformer(
                    hidden_states=pack(noisy).to(compute),
                    encoder_hidden_states=text.to(compute),
                    pooled_projections=pooled.to(compute),
                    timestep=sigmas.to(compute),
                    img_ids=image_ids(rows, rows, device),
                    txt_ids=text_ids,
                    guidance=None if guidance is None else guidance.to(compute),
                    return_dict=False,
                )[0]
            prediction = unpack(output, size, size)
            loss = torch.nn.functional.mse_loss(prediction.float(), (noise - latents).float())
            if fused is not None:
                fused.stepping = True
            loss.backward()
            if fused is None:
                opt.step()
            opt.zero_grad(set_to_none=True)
            finite &= bool(torch.isfinite(loss).item())  # waits for the device: the stamp marks the step's end
            times.append(time.perf_counter())
    return FluxGpuRun(
        device=_device_name(device),
        steps=steps,
        seconds=times[warmup + steps - 1] - times[warmup - 1],
        peak_allocated_bytes=memory.peak_bytes,
        peak_reserved_bytes=memory.reserved_bytes,
        weights_bytes=weights_bytes,
        base_parameters=base_parameters,
        optimizer=opt_name,
        weight_dtype=weight_dtype,
        compute_dtype=str(compute).removeprefix("torch."),
        resolution=resolution,
        image_tokens=rows * rows,
        text_tokens=text_tokens,
        batch_size=batch_size,
        rank=rank,
        lora_targets=len(targets),
        trained_parameters=trained_parameters,
        gradient_checkpointing=gradient_checkpointing,
        losses_finite=finite,
        attention=attention,
        offload_fraction=offload_fraction,
        offloaded_blocks=offload.offloaded if offload is not None else 0,
        blocks=len(transformer.transformer_blocks) + len(transformer.single_transformer_blocks),
        offload_host_bytes=offload.host_bytes() if offload is not None else 0,
        page_locked_buffers=offload.page_locked_buffers() if offload is not None else 0,
        attach_seconds=attach_seconds,
        async_copies=bool(offload is not None and async_copies and device.type == "cuda"),
        method=method,
        fused_back_pass=fused_back_pass,
    )


def _attention_backends(device: torch.device):
    """On CUDA, attention through flash or memory-efficient SDPA, not cuDNN's: on an H200 with torch 2.11 (cuDNN
    9.19) cuDNN's SDPA backward fails at Flux's 4608-token attention ("mha_graph.execute ... is_good()", an illegal
    memory access without CUDA_LAUNCH_BLOCKING). Elsewhere torch's default choice."""
    if device.type != "cuda":
        return contextlib.nullcontext(), "default"
    from torch.nn.attention import SDPBackend, sdpa_kernel

    allowed = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    return sdpa_kernel(allowed), "flash / memory-efficient SDPA (cuDNN's excluded)"


def format_flux_gpu(run: FluxGpuRun) -> str:
    offload = ""
    if run.offload_fraction > 0:
        copies = "copies ahead on a side stream" if run.async_copies else "copies in line"
        offload = (
            f", {run.offloaded_blocks} of {run.blocks} blocks offloaded ({run.offload_fraction:g}, {copies}; "
            f"{run.offload_host_bytes / GIB:.2f} GiB in CPU memory, {run.page_locked_buffers} buffers page-locked, "
            f"attached in {run.attach_seconds:.1f} s)"
        )
    reserved = f", {run.peak_reserved_bytes / GIB:.2f} GiB reserved" if run.peak_reserved_bytes is not None else ""
    allocated = "n/a" if run.peak_allocated_bytes is None else f"{run.peak_allocated_bytes / GIB:.2f} GiB"
    if run.method == "FINE_TUNE":
        what = f"the whole transformer trained{', fused back pass' if run.fused_back_pass else ''}"
        label = LABEL.replace("LoRA", "fine-tune")
    else:
        what = f"rank {run.rank} on {run.lora_targets} layers ({run.trained_parameters / 1e6:.1f} M trained)"
        label = LABEL
    return "\n".join(
        [
            f"{label} on {run.device}: {run.base_parameters / 1e9:.2f} B parameters in {run.weight_dtype} "
            f"({run.weights_bytes / GIB:.2f} GiB), {run.compute_dtype} compute, {what}, gradient checkpointing "
            f"{'on' if run.gradient_checkpointing else 'off'}, {run.resolution} px ({run.image_tokens} image + "
            f"{run.text_tokens} text tokens), batch {run.batch_size}, {run.optimizer}{offload}",
            f"  {run.steps_per_second:.3f} it/s ({run.seconds / run.steps:.2f} s/step over {run.steps} steps); peak "
            f"VRAM {allocated} allocated{reserved}; losses finite: {run.losses_finite}; attention: {run.attention}",
        ]
    )


def run_flux_gpu_part(steps: int, warmup: int, weight_dtypes: tuple[str, ...] = WEIGHT_DTYPES) -> dict:
    """The full-size step in each weight dtype on the first CUDA device; each None ("not measured") without one."""
    figures: dict = {}
    for dtype in weight_dtypes:
        label = f"{LABEL}, {dtype} weights, {RESOLUTION} px, batch 1"
        if not torch.cuda.is_available():
            print(f"{label}: not measured: no CUDA device")
            figures[dtype] = None
            continue
        run = flux_lora_benchmark(torch.device("cuda"), steps=steps, warmup=warmup, weight_dtype=dtype)
        print(format_flux_gpu(run))
        figures[dtype] = run.to_dict()
        del run
        gc.collect()
        torch.cuda.empty_cache()
    return figures
