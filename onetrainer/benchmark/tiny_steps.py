"""`scripts/benchmark.py --part tiny`: one training step of each tiny model's denoiser, the figure the test
fixtures' speed rests on. Which tiny models is each family's to say, in `<key>_tiny_step.py` beside this module
(`VARIANTS`, names of `onetrainer.tiny` variants), found by the family registry's keys."""

from __future__ import annotations

import importlib
import importlib.util


def tiny_step_variants() -> tuple[str, ...]:
    """Every family's timed tiny variants, in the family registry's order."""
    from onetrainer.families.registry import FAMILY_CLASSES

    variants: list[str] = []
    for key in FAMILY_CLASSES:
        name = f"{__package__}.{key}_tiny_step"
        if importlib.util.find_spec(name) is not None:
            variants += importlib.import_module(name).VARIANTS
    return tuple(dict.fromkeys(variants))


def measure_tiny_steps() -> dict[str, dict]:
    """Per tiny variant: every repetition's seconds and the best (the first repetition pays one-off setup)."""
    from onetrainer.tiny import build_tiny_pipeline
    from onetrainer.tiny.denoiser_step import time_training_step

    figures = {}
    for variant in tiny_step_variants():
        timings = time_training_step(build_tiny_pipeline(variant, seed=0))
        figures[variant] = {"seconds": timings, "best_seconds": min(timings)}
        each = " ".join(f"{t:.3f}" for t in timings)
        print(f"{variant:<12}{min(timings):>8.3f} s   (runs: {each})")
    return figures
