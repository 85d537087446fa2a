"""Python function calls per steady-state training step, ours and the bare loop's (the `overhead` part's setup): a
count, not a time, so it compares two versions of the trainer on a busy machine where step times spread by ±10 %.

Each loop runs twice after the same warm-up, `short` and `long` timed steps; the difference of the two counts over
`long - short` steps cancels loading, caching and tear-down. Calls are grouped by the package their code is in.
"""

from __future__ import annotations

import functools
import sys
import tempfile
import threading
from collections import Counter
from pathlib import Path

PACKAGES = ("onetrainer", "torch", "diffusers", "peft", "transformers")


def _package(filename: str) -> str:
    for name in PACKAGES:
        if f"/{name}/" in filename or f"\\{name}\\" in filename:
            return name
    return "other"


def _count_calls(run) -> Counter:
    counts: Counter = Counter()

    def profile(frame, event, _arg) -> None:
        if event == "call":
            counts[_package(frame.f_code.co_filename)] += 1

    threading.setprofile(profile)  # the trainer's own threads (loader, sinks) count too
    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    return counts


def count_step_calls(
    short: int = 4, long: int = 14, warmup: int = 3, prime: bool = True
) -> dict[str, dict[str, float]]:
    """{"ours" | "bare": {package: calls per step, "total": …}}; `prime` runs each loop once first, so that imports
    and first-use caches fall outside both counts."""
    import torch

    from onetrainer.benchmark import overhead

    result: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="onetrainer-benchmark-") as tmp:
        setup = overhead.prepare(Path(tmp), torch.device("cpu"))
        loops = {
            overhead.OURS: lambda steps: overhead.run_ours(setup, steps, warmup, name=f"calls-{steps}"),
            overhead.BARE: lambda steps: overhead.run_bare(setup, steps, warmup),
        }
        for variant, loop in loops.items():
            if prime:
                loop(1)
            before, after = (_count_calls(functools.partial(loop, n)) for n in (short, long))
            per_step = {k: (after[k] - before[k]) / (long - short) for k in sorted(set(before) | set(after))}
            per_step["total"] = sum(per_step.values())
            result[variant] = per_step
    return result


def format_step_calls(result: dict[str, dict[str, float]]) -> str:
    packages = [k for k in result[next(iter(result))] if k != "total"]
    lines = [f"{'':<6}" + "".join(f"{p:>13}" for p in [*packages, "total"])]
    for variant, counts in result.items():
        lines.append(f"{variant:<6}" + "".join(f"{counts.get(p, 0):>13.0f}" for p in [*packages, "total"]))
    return "\n".join(lines)
