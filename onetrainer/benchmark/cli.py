"""`scripts/benchmark.py`: the trainer-overhead table, the caching figures, with a CUDA device the GPU figures, and
the GUI's responsiveness (measured by `gui.latency`, handed in by the script: the core never imports the GUI)."""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from onetrainer.benchmark.memory import format_gib
from onetrainer.benchmark.parts import SHARED_PARTS

DESCRIPTION = (
    "Measure what the trainer adds per step (a tiny model's LoRA through run_training vs a bare diffusers+peft loop, "
    "same process, same maths; the same comparison for each family that declares one), how fast the cache fills and "
    "how soon a fully cached run starts, the window's responsiveness while the demo trains (--gui), and, with a CUDA "
    "device, full-size LoRA steps (it/s, peak VRAM)."
)
_CALLS_HELP = (
    "Python calls per steady step of the overhead part's two loops: a count that compares two versions of the "
    "trainer where times are too noisy"
)
_PRESETS_HELP = (
    "every shipped preset's estimated peak VRAM and host RAM at full size, recorded in docs/preset_memory.json and "
    ".md, the table tests/test_preset_memory.py guards; it prints what moved since the last"
)


def part_names() -> tuple[str, ...]:
    """Every part 'all' runs, in order: the shared ones with each family's overhead part (`family_overheads`)."""
    from onetrainer.benchmark.family_overhead import family_overheads

    first, rest = SHARED_PARTS[:2], SHARED_PARTS[2:]
    return (*first, *family_overheads(), *rest)


def part_help() -> dict[str, str]:
    """Each part's description for `--help`: a part that names a model says so in its own module."""
    from onetrainer.benchmark import memory_engine, model_split, offload
    from onetrainer.benchmark.family_overhead import family_overheads

    shared = {
        "overhead": "with a many-epoch case: what an epoch boundary costs",
        "calls": _CALLS_HELP,
        "offload": offload.PART_HELP,
        "caching": "",
        "weights": "FLOAT_8, INT_8, INT_W8A8 vs FLOAT_16 base weights; any machine",
        "memory": memory_engine.PART_HELP,
        "tiny": "one training step of each tiny model's denoiser, the figure the test fixtures' speed rests on",
        "ddp": "images/s at a fixed batch per process with 1 and --processes processes: GPUs with CUDA, else CPU "
        "processes on gloo",
        "split": model_split.PART_HELP,
        "gpu": "only with CUDA; otherwise reported as not measured",
        "gui": "needs a display or Xvfb",
    }
    families = {part: hook.help for part, hook in family_overheads().items()}
    return {part: shared[part] if part in shared else families[part] for part in part_names()}


def epilog() -> str:
    described = [f"'{part}'" + (f" ({text})" if text else "") for part, text in part_help().items()]
    text = (
        f"Parts: {', '.join(described)}, 'all' (every part; the GUI only where a display can be had). 'presets' (not "
        f"in 'all'): {_PRESETS_HELP}. Figures and what they mean: docs/benchmarks.md."
    )
    return textwrap.fill(text, width=119, break_long_words=False, break_on_hyphens=False)


def build_parser(prog: str = "benchmark.py") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog, description=DESCRIPTION, epilog=epilog(), formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=20, metavar="N", help="timed steps per run (default 20)")
    parser.add_argument("--warmup", type=int, default=3, metavar="N", help="untimed steps first (default 3)")
    parser.add_argument(
        "--repeat", type=int, default=3, metavar="R", help="alternating repetitions; medians are reported (default 3)"
    )
    parser.add_argument(
        "--part", choices=("all", *part_names(), "presets"), default="all", help="what to run (default all)"
    )
    parser.add_argument("--gui", action="store_true", help="only the GUI's responsiveness (same as --part gui)")
    parser.add_argument(
        "--images", type=int, default=64, metavar="N", help="images for the caching measurement (default 64)"
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        metavar="N",
        help="torch CPU threads (default 1; 0 = torch's default, one per core: see docs/benchmarks.md); "
        "the GUI part trains as the app does (cores - 1)",
    )
    parser.add_argument(
        "--no-memory",
        action="store_true",
        help="skip the CPU peak-RSS runs (each variant once more in a process of its own)",
    )
    parser.add_argument(
        "--processes", type=int, default=2, metavar="N", help="training processes for the ddp part (default 2)"
    )
    parser.add_argument(
        "--batch-size", type=int, default=2, metavar="B", help="batch per process for the ddp part (default 2)"
    )
    parser.add_argument(
        "--busy",
        type=int,
        default=0,
        metavar="N",
        help="the GUI part's input latency with N processes spinning beside it (a loaded CPU; default 0)",
    )
    parser.add_argument("--json", metavar="FILE", help="also write every figure to FILE")
    return parser


def main(
    argv: Sequence[str] | None = None, prog: str = "benchmark.py", gui_part: Callable[[bool, int], Any] | None = None
) -> int:
    """`gui_part(required, busy)` measures the GUI (`busy` processes loading the CPU beside its input measurement)
    and returns its figures, None when it cannot and was not required, or False when it cannot and was (the exit
    status is then 1)."""
    args = build_parser(prog).parse_args(argv)
    counts = (args.steps, args.warmup, args.repeat, args.images, args.batch_size)
    if min(counts) < 1 or min(args.threads, args.busy) < 0 or args.processes < 2:
        print(
            f"{prog}: error: --steps, --warmup, --repeat, --images and --batch-size must be at least 1, --threads and "
            "--busy at least 0, --processes at least 2",
            file=sys.stderr,
        )
        return 2
    parts = ["gui"] if args.gui else (list(part_names()) if args.part == "all" else [args.part])
    if args.part == "memory":
        parts = ["offload", "weights", "memory"]

    import torch

    from onetrainer.benchmark.memory import process_peak_rss
    from onetrainer.util.quiet import quiet_libraries

    quiet_libraries()
    if args.threads > 0:
        # With one thread per core, any other busy process makes OpenMP's waiting threads spin and the tiny model's
        # steps slow down 10-30x at random; one thread is as fast on an idle machine and time-shares fairly.
        torch.set_num_threads(args.threads)
    report: dict = {"machine": machine_info(), "date": datetime.date.today().isoformat()}
    print(f"machine: {report['machine']['summary']}; load average {report['machine']['load_average_before']}")
    if "overhead" in parts:
        from onetrainer.benchmark.overhead import compare_overhead

        print(f"\nTrainer overhead ({args.repeat} alternating repetitions, {args.steps} timed steps each):")
        overhead = compare_overhead(args.steps, args.warmup, args.repeat, memory=not args.no_memory)
        print()
        print(format_overhead(overhead))
        report["overhead"] = overhead.to_dict()
        from onetrainer.benchmark.epochs import STEPS, format_epoch_boundaries, time_epoch_boundaries

        steps = max(args.steps, STEPS)
        print(f"\nEpoch boundaries (ours on few and more images, {steps} timed steps each, workers as the default):")
        epochs = time_epoch_boundaries(steps, args.warmup)
        print(format_epoch_boundaries(epochs))
        report["epoch_boundaries"] = [case.to_dict() for case in epochs]
    if "calls" in parts:
        from onetrainer.benchmark.step_calls import count_step_calls, format_step_calls

        print("\nPython calls per steady-state step (the overhead part's loops; a count, not a time):")
        calls = count_step_calls()
        print(format_step_calls(calls))
        report["calls"] = calls
    from onetrainer.benchmark.family_overhead import compare_with_bare, family_overheads

    overheads = {part: hook for part, hook in family_overheads().items() if part in parts}
    for part, hook in overheads.items():
        print(f"\nTrainer overhead on {hook.label} ({args.repeat} alternating repetitions):")
        figures = compare_with_bare(hook, max(args.steps // 2, 1), args.warmup, args.repeat)
        print(format_family_overhead(figures))
        report[part] = figures
    for part, hook in overheads.items():
        for key, measure in hook.extras.items():
            report[part][key] = measure(max(args.steps // 2, 1), args.warmup)
    if "offload" in parts:
        from onetrainer.benchmark import offload
        from onetrainer.benchmark.offload import compare_offload, format_offload

        print(f"\n{offload.TITLE} ({args.repeat} alternating repetitions):")
        offload = compare_offload(max(args.steps // 2, 1), args.warmup, args.repeat)
        print(format_offload(offload))
        report["offload"] = offload
    if "caching" in parts:
        from onetrainer.benchmark.caching import measure_caching

        print(f"\nCaching ({args.images} images, an empty cache and then a full one):")
        caching = measure_caching(args.images)
        print(format_caching(caching))
        report["caching"] = caching.to_dict()
    if "weights" in parts:
        from onetrainer.benchmark.weights import format_weight_dtypes, measure_weight_dtypes

        print("\nBase weights, FLOAT_8, INT_8 and INT_W8A8 vs FLOAT_16 (each in a process of its own):")
        weights = measure_weight_dtypes()
        print(format_weight_dtypes(weights))
        report["weights"] = weights
    if "memory" in parts:
        from onetrainer.benchmark import memory_engine
        from onetrainer.benchmark.memory_engine import compare_gguf, format_gguf, run_memory_gpu_part

        print(f"\n{memory_engine.GGUF_TITLE} ({args.repeat} alternating repetitions):")
        gguf = compare_gguf(max(args.steps // 2, 1), args.warmup, args.repeat)
        print(format_gguf(gguf))
        report["gguf"] = gguf

        print("\nThe memory engine at full size (CUDA only):")
        report["memory"] = run_memory_gpu_part(max(args.steps // 4, 1), max(args.warmup - 1, 1))
    if "presets" in parts:
        report["presets"] = record_preset_memory()
    if "tiny" in parts:
        print("\nTiny models, one denoiser training step (forward + backward, batch 2; best of 3):")
        from onetrainer.benchmark.tiny_steps import measure_tiny_steps

        report["tiny"] = measure_tiny_steps()
    if "ddp" in parts:
        from onetrainer.benchmark.ddp import format_ddp, measure_ddp

        print(f"\nSeveral training processes (1 and {args.processes}):")
        ddp = measure_ddp(args.processes, args.steps, args.warmup, args.batch_size)
        print(format_ddp(ddp))
        report["ddp"] = ddp.to_dict()
    if "split" in parts:
        from onetrainer.benchmark import model_split

        print(f"\n{model_split.TITLE} ({args.repeat} alternating repetitions):")
        report["split"] = model_split.compare_split(args.repeat)
    if "gpu" in parts:
        report["gpu"] = run_gpu_part(args.steps, args.warmup)
    if "gui" in parts:
        required = args.gui or args.part == "gui"
        if gui_part is None:
            print("\nGUI responsiveness: not measured: run scripts/benchmark.py, which brings the GUI")
            report["gui"] = False if required else None
        else:
            report["gui"] = gui_part(required, args.busy)
    report["process_peak_rss_bytes"] = process_peak_rss()
    report["machine"]["load_average_after"] = _load_average()
    peak = format_gib(report["process_peak_rss_bytes"])
    print(f"\nprocess peak RSS (ru_maxrss: the whole process, every run above together): {peak}")
    print(f"load average after: {report['machine']['load_average_after']}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2), encoding="utf-8")
        print(f"figures written to {args.json}")
    return 0 if report.get("gui") is not False else 1


def record_preset_memory() -> dict[str, dict]:
    """Every preset's estimated peaks, recorded as the table the tests guard; what moved since the last is printed."""
    from onetrainer.benchmark import preset_memory as table

    print("\nEvery preset's estimated peak VRAM and host RAM (a CUDA GPU, the released full-size models):")
    rows = table.preset_figures()
    if table.TABLE_FILE.is_file():
        moved = table.compare(table.read_table(), rows)
        print("\n".join(["", "Since the last table:", *(f"  {m}" for m in moved)]) if moved else "\nNothing moved.")
    table.write_table(rows)
    print(f"recorded in {table.TABLE_FILE} and {table.PAGE_FILE}")
    return rows


def run_gpu_part(steps: int, warmup: int) -> dict:
    """Both GPU cases on the first CUDA device; each None ("not measured") without one."""
    import torch

    from onetrainer.benchmark.gpu import CASES, format_gpu, unet_lora_benchmark

    figures: dict = {}
    for key, case in CASES.items():
        print()
        label = f"{case.label}, {case.resolution} px, batch 1"
        if not torch.cuda.is_available():
            print(f"{label}: not measured: no CUDA device")
            figures[key] = None
            continue
        run = unet_lora_benchmark(key, torch.device("cuda"), steps=steps, warmup=warmup)
        print(format_gpu(run))
        figures[key] = run.to_dict()
        torch.cuda.empty_cache()
    return figures


def machine_info() -> dict:
    import diffusers
    import peft
    import torch
    import transformers

    cuda = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    cores = _cpu_count()
    versions = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "diffusers": diffusers.__version__,
        "transformers": transformers.__version__,
        "peft": peft.__version__,
    }
    summary = f"{cores}-core {platform.machine()} CPU, " + (f"GPU {cuda}" if cuda else "no GPU") + ", "
    summary += ", ".join(f"{k} {v}" for k, v in versions.items() if k != "python")
    return {
        "load_average_before": _load_average(),
        "cpu_cores": cores,
        "platform": platform.platform(),
        "gpu": cuda,
        "versions": versions,
        "summary": summary,
    }


def format_overhead(result) -> str:
    from onetrainer.benchmark.overhead import BARE, GOAL_RATIO, LABELS, OURS

    s = result.settings
    lines = [
        f"tiny SD 1.5 {s['method']} rank {s['lora_rank']} ({s['layer_filter_preset']} layers), {s['resolution']} px, "
        f"batch {s['batch_size']}, {s['optimizer']}, gradient checkpointing {_on(s['gradient_checkpointing'])}, "
        f"latent caching {_on(s['latent_caching'])}",
        f"device {result.device}, torch threads {s['torch_threads']}; median of {s['repeat']} alternating repetitions "
        f"of {s['steps']} steps after {s['warmup']} warm-up steps",
        f"{'run':<28}{'steps/s':>9}   {'all runs':<24}{'peak memory':>12}",
    ]
    kinds = set()
    for variant, runs in result.runs.items():
        each = " ".join(f"{r.steps_per_second:.2f}" for r in runs)
        peak, kind = result.peak_memory(variant)
        kinds.add(kind)
        above = result.memory_above_baseline(variant)
        extra = f" (+{above / 1024**2:.0f} MiB)" if above is not None else ""
        rate = result.median_rate(variant)
        lines.append(f"{LABELS[variant]:<28}{rate:>9.2f}   {each:<24}{format_gib(peak):>12}{extra}")
    lines.append(
        f"(peak memory: {', '.join(sorted(kinds))}, model loading included; "
        "(+N MiB): above that process's RSS with the libraries imported)"
    )
    if OURS in result.runs and BARE in result.runs:
        ratio = result.ratio(BARE)
        verdict = "met" if ratio >= GOAL_RATIO else "NOT met"
        robust = result.ratio(BARE, per_step=True)
        lines.append(
            f"ratio ours / bare: {ratio:.3f} (goal >= {GOAL_RATIO}: {verdict}); from median step times: {robust:.3f}"
        )
        cpu = result.cpu_ratio(BARE)
        if cpu is not None and result.device == "cpu":
            # Wall time on a shared machine moves 10-20 % with the other processes' load; CPU time barely does.
            lines.append(f"ratio from the process's CPU time per step (steady under other processes' load): {cpu:.3f}")
    return "\n".join(lines)


def format_family_overhead(figures: dict) -> str:
    """One per-family comparison's figures: both rates, the ratio, the CPU-time ratio and the trained count where
    measured."""
    line = (
        f"ours {figures['ours_steps_per_second']:.2f} steps/s, bare {figures['bare_steps_per_second']:.2f} "
        f"steps/s: ratio {figures['ratio']:.3f} (goal ≥ 0.95)"
    )
    runs = "; ".join(f"{v}: {' '.join(f'{r:.2f}' for r in rates)}" for v, rates in figures["runs"].items())
    lines = [line, f"  runs (steps/s) {runs}"]
    if figures.get("cpu_ratio") is not None and figures["device"] == "cpu":
        lines.append(
            f"  ratio from the process's CPU time per step (steady under other load): {figures['cpu_ratio']:.3f}"
        )
    if figures.get("trained_parameters") is not None:
        lines.append(f"  both train {figures['trained_parameters']} LoRA parameters")
    return "\n".join(lines)


def format_caching(result) -> str:
    cold, warm = result.cold, result.warm
    return "\n".join(
        [
            f"tiny SD 1.5, demo preset ({result.resolution} px), {result.images} images of 4 sizes, {result.device}",
            f"  filling the cache: {cold.latents_encoded} latents in {cold.latent_seconds:.2f} s = "
            f"{cold.images_per_second:.1f} images/s; {cold.captions_encoded} captions encoded",
            f"  start to first step: {cold.seconds_to_first_step:.2f} s with an empty cache, "
            f"{warm.seconds_to_first_step:.2f} s fully cached ({warm.latents_encoded} latents and "
            f"{warm.captions_encoded} captions encoded the second time)",
        ]
    )


def _on(flag: bool) -> str:
    return "on" if flag else "off"


def _load_average() -> list[float] | None:
    """Other work on the machine skews every figure: the load average before and after says how quiet it was."""
    import os

    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def _cpu_count() -> int:
    import os

    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


if __name__ == "__main__":
    sys.exit(main())
