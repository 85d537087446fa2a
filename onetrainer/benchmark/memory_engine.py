"""`scripts/benchmark.py --part memory`: the memory engine's figures.

On any machine it runs the 'offload' part (tiny FLUX.1-dev trained through `run_training` with its blocks offloaded,
against the plain run), the 'weights' part (FLOAT_8, INT_8, INT_W8A8 against FLOAT_16 base weights) and GGUF weights
(`compare_gguf`: the same tiny LoRA run with its transformer read from a Q8_0 or Q4_0 .gguf file, dequantized as each
layer runs, against the plain weights). With CUDA it
also times the full-size cases the issue sets goals for, each in `flux_gpu.flux_lora_benchmark` or
`gpu.unet_lora_benchmark` (random weights of the released topology, the trainer's quantization and offloading code):

- FLUX.1-dev LoRA with FLOAT_8 weights at 512 and 1024 px, without offloading and with 70 % of the blocks offloaded
  (the 8 GB preset's fraction; goal: at most 8 GB at 512 px, at most 10 % slower than without offloading when the
  copies overlap), and at 1024 px with the copies in line (how much the side stream hides);
- the 8-bit kinds' speed at 1024 px (INT_W8A8, FLOAT_W8A8: 8-bit matmuls), and bf16 weights half offloaded;
- the same two kinds compressed (INT_W8A8_COMPRESSED, FLOAT_W8A8_COMPRESSED; normal-distributed weights);
- a full fine-tune at 512 px (bf16 weights, Adafactor): ordinary, with the fused back pass, and with 70 % of the
  blocks offloaded with their trained weights and optimizer state;
- an SDXL-size UNet LoRA at 1024 px with FLOAT_8 weights (goal: at most 4.5 GB).

Without CUDA each of those is reported as not measured.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass

import torch

from onetrainer.benchmark.memory import GIB

FLUX_8GB_GOAL = 8 * GIB  # at 512 px with 8-bit weights and offloading
SDXL_GOAL = int(4.5 * GIB)


@dataclass(frozen=True)
class FluxCase:
    weight_dtype: str
    resolution: int
    offload_fraction: float = 0.0
    async_copies: bool = True
    method: str = "LORA"
    fused_back_pass: bool = False

    @property
    def key(self) -> str:
        offload = f"-offload{self.offload_fraction:g}" + ("" if self.async_copies else "-inline")
        method = "-finetune" + ("-fused" if self.fused_back_pass else "") if self.method == "FINE_TUNE" else ""
        return f"flux-{self.weight_dtype}-{self.resolution}{method}" + (offload if self.offload_fraction else "")


# In the order of what matters most, so that a run cut short still has the goals' figures.
FLUX_CASES = (
    FluxCase("FLOAT_8", 512),
    FluxCase("FLOAT_8", 512, 0.7),
    FluxCase("FLOAT_8", 1024),
    FluxCase("FLOAT_8", 1024, 0.7),
    FluxCase("FLOAT_8", 1024, 0.7, async_copies=False),
    FluxCase("INT_W8A8", 1024),
    FluxCase("FLOAT_W8A8", 1024),
    FluxCase("BFLOAT_16", 1024, 0.5),
    # The W8A8 kinds compressed (nvCOMP): memory saved and speed lost against the two rows above them.
    FluxCase("INT_W8A8_COMPRESSED", 1024),
    FluxCase("FLOAT_W8A8_COMPRESSED", 1024),
    # A full fine-tune (Adafactor, bfloat16 weights): ordinary, with the fused back pass, and with 70 % of the blocks
    # offloaded with their trained weights and optimizer state.
    FluxCase("BFLOAT_16", 512, method="FINE_TUNE"),
    FluxCase("BFLOAT_16", 512, method="FINE_TUNE", fused_back_pass=True),
    FluxCase("BFLOAT_16", 512, 0.7, method="FINE_TUNE", fused_back_pass=True),
)


GGUF_KINDS = ("Q8_0", "Q4_0")
GGUF_TITLE = "GGUF weights on tiny FLUX.1-dev's transformer"
PART_HELP = (
    "the memory engine: 'offload' and 'weights', and with CUDA the full-size Flux.1-dev LoRA with 8-bit weights and "
    "layer offloading at 512 and 1024 px and an SDXL-size LoRA with FLOAT_8 weights, it/s and peak VRAM against the "
    "goals"
)


def compare_gguf(
    steps: int = 5, warmup: int = 2, repeat: int = 3, kinds: tuple[str, ...] = GGUF_KINDS, progress=print
) -> dict:
    """Median steps/s of the flux part's tiny LoRA run with the transformer from a .gguf file of each kind (GGUF
    weights) and with its plain weights, alternating, with the ratio to the plain run."""
    import statistics
    import tempfile
    from pathlib import Path

    from onetrainer.benchmark.family_overhead import run_ours
    from onetrainer.benchmark.flux_overhead import flux_config
    from onetrainer.config.enums import DataType
    from onetrainer.tiny.gguf_file import write_gguf_transformer

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    variants = ("plain", *kinds)
    rates: dict[str, list[float]] = {v: [] for v in variants}
    with tempfile.TemporaryDirectory(prefix="onetrainer-benchmark-gguf-") as tmp:
        workdir = Path(tmp)
        config, _images = flux_config(workdir, device)
        plain_dtype = config.transformer.weight_dtype
        files = {kind: write_gguf_transformer(workdir / f"flux-{kind}.gguf", kinds=(kind,)) for kind in kinds}
        for rep in range(repeat):
            for variant in variants if rep % 2 == 0 else tuple(reversed(variants)):
                gguf = variant != "plain"
                config.transformer.model_name = str(files[variant]) if gguf else ""
                config.transformer.weight_dtype = DataType.GGUF if gguf else plain_dtype
                run = run_ours(config, workdir, device, steps, warmup, f"gguf-{variant}-{rep}")
                rates[variant].append(run.steps_per_second)
                if progress is not None:
                    progress(f"  repetition {rep + 1}/{repeat}: {variant:<6} {run.steps_per_second:7.2f} steps/s")
    plain = statistics.median(rates["plain"])
    runs = {
        v: {"steps_per_second": statistics.median(r), "ratio": statistics.median(r) / plain if plain else 0.0,
            "rates": r}
        for v, r in rates.items()
    }  # fmt: skip
    return {"device": str(device), "steps": steps, "warmup": warmup, "repeat": repeat, "runs": runs}


def format_gguf(figures: dict) -> str:
    lines = []
    for variant, run in figures["runs"].items():
        rates = " ".join(f"{r:.2f}" for r in run["rates"])
        what = "plain weights" if variant == "plain" else f"GGUF {variant}"
        lines.append(
            f"{what}: {run['steps_per_second']:.2f} steps/s, {run['ratio']:.3f} of the plain run (runs {rates})"
        )
    return "\n".join(lines)


def run_memory_gpu_part(steps: int, warmup: int, progress=print) -> dict:
    """The full-size cases on the first CUDA device, each a dict (or None, "not measured", without CUDA or when it
    fails: the error is printed and the others go on)."""
    from onetrainer.benchmark.flux_gpu import flux_lora_benchmark, format_flux_gpu
    from onetrainer.benchmark.gpu import format_gpu, unet_lora_benchmark

    cuda = torch.cuda.is_available()
    figures: dict = {}
    for case in FLUX_CASES:
        if not cuda:
            progress(f"{case.key}: not measured: no CUDA device")
            figures[case.key] = None
            continue
        try:
            run = flux_lora_benchmark(
                torch.device("cuda"), steps=steps, warmup=warmup, resolution=case.resolution,
                weight_dtype=case.weight_dtype, offload_fraction=case.offload_fraction, async_copies=case.async_copies,
                method=case.method, fused_back_pass=case.fused_back_pass,
            )  # fmt: skip
        except Exception as e:  # one case's failure (out of memory, a kernel this card lacks) is a figure too
            progress(f"{case.key}: failed: {type(e).__name__}: {str(e)[:300]}")
            figures[case.key] = {"error": f"{type(e).__name__}: {e}"}
        else:
            progress(format_flux_gpu(run))
            figures[case.key] = {**run.to_dict(), "goal_8gb_met": _within(run.peak_allocated_bytes, FLUX_8GB_GOAL)}
        _release()
    key = "sdxl-FLOAT_8-1024"
    if not cuda:
        progress(f"{key}: not measured: no CUDA device")
        figures[key] = None
        return figures
    try:
        sdxl = unet_lora_benchmark("sdxl", torch.device("cuda"), steps=steps, warmup=warmup, float8_weights=True)
    except Exception as e:
        progress(f"{key}: failed: {type(e).__name__}: {str(e)[:300]}")
        figures[key] = {"error": f"{type(e).__name__}: {e}"}
    else:
        progress(format_gpu(sdxl))
        figures[key] = {**sdxl.to_dict(), "goal_met": _within(sdxl.peak_allocated_bytes, SDXL_GOAL)}
    _release()
    return figures


def _within(peak: int | None, goal: int) -> bool:
    return peak is not None and peak <= goal


def _release() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
