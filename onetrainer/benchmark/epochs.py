"""What an epoch boundary costs: a small dataset trained for many epochs, as LoRA users train (10-30 images for a
hundred epochs or more), beside a larger one that crosses few boundaries.

Our `run_training` trains the overhead part's tiny SD 1.5 LoRA (`overhead.py`) on `image_count` of the demo's images,
with the data loader's worker processes at the setting's default (as users have them; the demo preset loads in the
training thread). The work of a boundary (ending the epoch, starting the next one's batches) falls in the time of the
step that begins an epoch, so its cost is the median time of those steps less the median of the others: medians, as
other processes' load on a shared machine slows a few steps at random. Goal: a boundary costs under 5 % of a step.
"""

from __future__ import annotations

import statistics
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from onetrainer.benchmark.overhead import Run, prepare, run_ours

GOAL_SHARE = 0.05  # an epoch boundary must cost less than this share of a step
MIN_BOUNDARIES = 5  # a case with fewer gives too few steps for a median: its figure is shown, not judged
IMAGE_COUNTS = (10, 60)
STEPS = 60  # timed steps of each case: 12 epochs of 10 images at batch 2


@dataclass(frozen=True)
class EpochCase:
    images: int
    workers: int  # the data loader's worker processes
    run: Run

    @property
    def boundaries(self) -> int:
        return sum(self.run.first_of_epoch)

    def boundary_seconds(self, cpu: bool = False) -> float | None:
        """The median time of a step that began an epoch less that of the others (None without both kinds)."""
        times = self.run.cpu_seconds if cpu else self.run.step_seconds
        first = [t for t, begins in zip(times, self.run.first_of_epoch, strict=True) if begins]
        others = [t for t, begins in zip(times, self.run.first_of_epoch, strict=True) if not begins]
        if not first or not others:
            return None
        return statistics.median(first) - statistics.median(others)

    def boundary_share(self, cpu: bool = False) -> float | None:
        """The boundary's cost as a share of a step (the median of the steps that begin no epoch)."""
        extra = self.boundary_seconds(cpu)
        times = self.run.cpu_seconds if cpu else self.run.step_seconds
        others = [t for t, begins in zip(times, self.run.first_of_epoch, strict=True) if not begins]
        return extra / statistics.median(others) if extra is not None and statistics.median(others) > 0 else None

    def to_dict(self) -> dict:
        return {
            "images": self.images,
            "workers": self.workers,
            "epoch_boundaries": self.boundaries,
            "steps_per_second": self.run.steps_per_second,
            "cpu_steps_per_second": self.run.cpu_steps_per_second,
            "boundary_seconds": self.boundary_seconds(),
            "boundary_share_of_a_step": self.boundary_share(),
            "boundary_cpu_seconds": self.boundary_seconds(cpu=True),
            "goal_share": GOAL_SHARE,
            "run": asdict(self.run),
        }


def time_epoch_boundaries(
    steps: int = STEPS,
    warmup: int = 3,
    image_counts: tuple[int, ...] = IMAGE_COUNTS,
    workers: int | None = None,
    device: torch.device | None = None,
    progress=print,
) -> list[EpochCase]:
    """One run of our trainer per image count, `steps` timed steps after `warmup`; `workers` defaults to the
    `dataloader_threads` setting's default."""
    from onetrainer.config import TrainConfig

    workers = TrainConfig().dataloader_threads if workers is None else workers
    cases = []
    for count in image_counts:
        with tempfile.TemporaryDirectory(prefix="onetrainer-benchmark-") as tmp:
            setup = prepare(Path(tmp), device, count, f"dataloader_threads={workers}")
            case = EpochCase(count, workers, run_ours(setup, steps, warmup))
        cases.append(case)
        if progress is not None:
            progress(f"  {count} images: {case.run.steps_per_second:.2f} steps/s, {case.boundaries} epoch boundaries")
    return cases


def format_epoch_boundaries(cases: list[EpochCase]) -> str:
    lines = [
        f"{'images':>6}{'workers':>9}{'boundaries':>12}{'steps/s':>9}{'CPU steps/s':>13}"
        f"{'boundary ms':>13}{'of a step':>11}{'CPU ms':>8}"
    ]
    for case in cases:
        extra, share, cpu = case.boundary_seconds(), case.boundary_share(), case.boundary_seconds(cpu=True)
        lines.append(
            f"{case.images:>6}{case.workers:>9}{case.boundaries:>12}{case.run.steps_per_second:>9.2f}"
            f"{case.run.cpu_steps_per_second:>13.2f}{_ms(extra):>13}{_percent(share):>11}{_ms(cpu):>8}"
        )
    judged = [c.boundary_share() for c in cases if c.boundaries >= MIN_BOUNDARIES]
    shares = [s for s in judged if s is not None]
    if shares:
        worst = max(shares)
        verdict = "met" if worst < GOAL_SHARE else "NOT met"
        lines.append(
            f"an epoch boundary costs at most {worst:.1%} of a step (goal < {GOAL_SHARE:.0%}: {verdict}; judged on "
            f"the cases with {MIN_BOUNDARIES} boundaries or more)"
        )
    lines.append("(CPU: this process's; the workers' loading is in their own processes)")
    return "\n".join(lines)


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f}"


def _percent(share: float | None) -> str:
    return "-" if share is None else f"{share:.1%}"
