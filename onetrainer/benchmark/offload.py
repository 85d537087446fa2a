"""`scripts/benchmark.py --part offload`: the cost of layer offloading, ours with and without it on tiny FLUX.1-dev.

The same LoRA config (the flux part's) trains through `run_training` with the transformer's `offload_fraction` at 0 and
at each fraction asked for, alternating, and the median steps/s of each is compared with the plain run's. On a CPU a
block's "copy to the device" is a clone, so the figure is the offloading's bookkeeping and copy cost, not a PCIe
transfer; on CUDA it includes the host-to-device copies (overlapped with compute on a side stream) and the peak VRAM.
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path

import torch

FRACTIONS = (0.5, 0.75)
TITLE = "Layer offloading on tiny FLUX.1-dev's transformer"
PART_HELP = (
    "tiny FLUX.1-dev's LoRA steps with the transformer's layers offloaded, 0.5 and 0.75, against none: steps/s, and "
    "peak VRAM on CUDA"
)


def compare_offload(
    steps: int = 5, warmup: int = 2, repeat: int = 3, fractions: tuple[float, ...] = FRACTIONS, progress=print
) -> dict:
    """Median steps/s (and peak device memory on CUDA) per offload fraction, with the ratio to the plain run."""
    from onetrainer.benchmark.family_overhead import run_ours
    from onetrainer.benchmark.flux_overhead import flux_config

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    variants = (0.0, *fractions)
    rates: dict[float, list[float]] = {f: [] for f in variants}
    peaks: dict[float, list[int | None]] = {f: [] for f in variants}
    with tempfile.TemporaryDirectory(prefix="onetrainer-benchmark-offload-") as tmp:
        workdir = Path(tmp)
        config, _images = flux_config(workdir, device)
        for rep in range(repeat):
            order = variants if rep % 2 == 0 else tuple(reversed(variants))
            for fraction in order:
                config.transformer.offload_fraction = fraction
                run = run_ours(config, workdir, device, steps, warmup, f"offload-{fraction}-{rep}")
                rates[fraction].append(run.steps_per_second)
                peaks[fraction].append(run.peak_cuda_bytes)
                if progress is not None:
                    progress(
                        f"  repetition {rep + 1}/{repeat}: offload {fraction:.2f} {run.steps_per_second:7.2f} steps/s"
                    )
    plain = statistics.median(rates[0.0])
    figures: dict = {"device": str(device), "steps": steps, "warmup": warmup, "repeat": repeat, "runs": {}}
    for fraction in variants:
        median = statistics.median(rates[fraction])
        known = [p for p in peaks[fraction] if p is not None]
        figures["runs"][f"{fraction:g}"] = {
            "steps_per_second": median,
            "ratio": median / plain if plain else 0.0,
            "rates": rates[fraction],
            "peak_bytes": max(known) if known else None,
        }
    return figures


def format_offload(figures: dict) -> str:
    lines = []
    for fraction, run in figures["runs"].items():
        peak = f", peak {run['peak_bytes'] / 2**20:.0f} MiB" if run["peak_bytes"] else ""
        rates = " ".join(f"{r:.2f}" for r in run["rates"])
        lines.append(
            f"offload {fraction}: {run['steps_per_second']:.2f} steps/s, {run['ratio']:.3f} of the plain run{peak} "
            f"(runs {rates})"
        )
    return "\n".join(lines)
