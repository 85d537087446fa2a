"""The quantized base weights against FLOAT_16: the memory and time of a LoRA step on a mid-size SD 1.5-shaped UNet,
on the CPU.

Each dtype trains in a fresh process (`probe_peak_rss`): the UNet (SD 1.5's topology at half width, ~215 M
parameters, so the weights dominate as they do at full size) is built, stored as FLOAT_16, as float8
(`precision/quantize.to_float8`) or as INT_8 / INT_W8A8 (`precision/quantize.to_scaled_8bit`), and takes LoRA steps at
a 16×16 latent in float16. The figures are the stored weight bytes, the peak RSS above the process's RSS with the
libraries imported, and the time of the steps after the first.
"""

from __future__ import annotations

import gc
import json
import time

import torch

DTYPES = ("FLOAT_16", "FLOAT_8", "INT_8", "INT_W8A8")


def probe_weight_dtype(dtype: str, steps: int = 2) -> dict:
    from onetrainer.benchmark.memory import probe_peak_rss

    return probe_peak_rss(f"from onetrainer.benchmark.weights import probe_main; probe_main({dtype!r}, {int(steps)})")


def half_width_unet():
    from onetrainer.tiny import reference
    from onetrainer.tiny.components import instantiate

    config = {**reference.SD15_UNET, "block_out_channels": [160, 320, 640, 640], "cross_attention_dim": 768}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return instantiate(config).eval()


def probe_main(dtype: str, steps: int) -> None:
    """The child side: prints one JSON line with the stored weight bytes and the peak RSS above the baseline."""
    from peft import LoraConfig, inject_adapter_in_model

    from onetrainer.benchmark.memory import current_rss, peak_rss_since_reset, process_peak_rss, reset_peak_rss
    from onetrainer.config.enums import DataType
    from onetrainer.precision.quantize import to_float8, to_scaled_8bit

    unet = half_width_unet().to(torch.float16)
    unet.requires_grad_(False)
    if dtype == "FLOAT_8":
        to_float8(unet)
    elif dtype != "FLOAT_16":
        to_scaled_8bit(unet, DataType(dtype))
    stored = sum(t.numel() * t.element_size() for t in (*unet.parameters(), *unet.buffers()))
    targets = ["to_q", "to_k", "to_v", "to_out.0"]
    inject_adapter_in_model(LoraConfig(r=4, lora_alpha=4, target_modules=targets), unet)
    params = [p for n, p in unet.named_parameters() if "lora_" in n]
    for p in params:
        p.data = p.data.float()
        p.requires_grad_(True)
    optimizer = torch.optim.AdamW(params, lr=1e-4)
    gc.collect()
    baseline = current_rss()
    exact = reset_peak_rss()
    generator = torch.Generator().manual_seed(0)
    losses = []
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        latents = torch.randn(1, 4, 16, 16, generator=generator, dtype=torch.float16)
        text = torch.randn(1, 77, 768, generator=generator, dtype=torch.float16)
        with torch.autocast("cpu", dtype=torch.float16):
            prediction = unet(latents, torch.tensor([500]), encoder_hidden_states=text).sample
        loss = torch.nn.functional.mse_loss(prediction.float(), latents.float())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(float(loss))
        times.append(time.perf_counter() - started)
    peak = peak_rss_since_reset() if exact else process_peak_rss()
    figures = {"dtype": dtype, "stored_weight_bytes": stored, "baseline_rss_bytes": baseline, "peak_rss_bytes": peak}
    figures["losses"] = losses
    later = times[1:] or times
    figures["seconds_per_step"] = sum(later) / len(later)
    print(json.dumps(figures))


def measure_weight_dtypes(steps: int = 3) -> dict[str, dict]:
    return {dtype: probe_weight_dtype(dtype, steps) for dtype in DTYPES}


def format_weight_dtypes(figures: dict[str, dict]) -> str:
    gib = 1024**3
    lines = ["half-width SD 1.5 UNet (~215 M parameters), LoRA rank 4 on attention, 16×16 latent, float16 compute, CPU"]
    lines.append(f"{'weights':<10}{'stored':>12}{'peak RSS':>12}{'above baseline':>16}{'s/step':>9}")
    for dtype, f in figures.items():
        above = f["peak_rss_bytes"] - f["baseline_rss_bytes"]
        line = f"{dtype:<10}{f['stored_weight_bytes'] / gib:>11.2f}G{f['peak_rss_bytes'] / gib:>11.2f}G"
        step = f.get("seconds_per_step")
        lines.append(line + f"{above / gib:>15.2f}G" + (f"{step:>9.2f}" if step is not None else ""))
    return "\n".join(lines)
