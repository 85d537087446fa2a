"""Validation that says which checkpoint to keep.

Every validation image is noised with the same noise at the same four times each time (the middle of each quarter of
the schedule, `RANGES`), so the curve moves only when the model does. The result is logged as the mean
(`validation/loss`), per quarter (`validation/loss_t0-250` …, in thousandths of the schedule from the clean end) and per
concept (OneTrainer's `loss/validation_step/<concept>` and `…/total_average`).

Every save, backup and final model records the validation loss of its weights; `ValidationRecord` keeps them, per run,
in `validation.json` in the workspace and names the best one.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import torch

from onetrainer.util.fs import atomic_write_json

log = logging.getLogger(__name__)

FILE_NAME = "validation.json"
FORMAT_VERSION = 1
# Quarters of the schedule in thousandths, from the clean end (0) to pure noise (1000): one fixed time in each.
RANGES: tuple[tuple[int, int], ...] = ((0, 250), (250, 500), (500, 750), (750, 1000))
# The header keys of a saved file's validation loss and the step it was measured at.
LOSS_METADATA_KEY = "ot_validation_loss"
STEP_METADATA_KEY = "ot_validation_step"


def range_fractions() -> torch.Tensor:
    """The fixed time of each range, as a fraction of the schedule (its middle)."""
    return torch.tensor([(low + high) / 2000 for low, high in RANGES], dtype=torch.float64)


def range_name(index: int) -> str:
    low, high = RANGES[index]
    return f"t{low}-{high}"


def progress_label(epoch: int, epoch_step: int, step: int) -> str:
    """ "epoch 7" for a checkpoint at the end of the 7th epoch, "step 45 (epoch 3)" for one inside the 3rd."""
    return f"epoch {epoch}" if epoch_step == 0 else f"step {step} (epoch {epoch + 1})"


@dataclass(frozen=True)
class ValidationResult:
    step: int
    epoch: int  # as the progress counts it: epochs done when epoch_step is 0, else the 0-based epoch in progress
    epoch_step: int
    loss: float  # the mean over every image and range
    ranges: dict[str, float]  # "t0-250" → the mean over the images at that range's time
    concepts: dict[str, float]  # concept name → the mean over its images and the ranges

    def scalars(self) -> dict[str, float]:
        """The TensorBoard tags of this validation."""
        values = {"validation/loss": self.loss}
        values.update({f"validation/loss_{name}": value for name, value in self.ranges.items()})
        values.update({f"loss/validation_step/{name}": value for name, value in self.concepts.items()})
        if self.concepts:  # OneTrainer's: the mean of the concepts' means
            values["loss/validation_step/total_average"] = sum(self.concepts.values()) / len(self.concepts)
        return values


def combine(per_image: list[tuple[str, list[float]]], step: int, epoch: int, epoch_step: int) -> ValidationResult:
    """The result of the images' losses, `per_image`: (concept name, one loss per range) in image order (so the sums
    are the same whichever ranks measured which image)."""
    ranges = {range_name(i): _mean([losses[i] for _, losses in per_image]) for i in range(len(RANGES))}
    concepts: dict[str, list[float]] = {}
    for name, losses in per_image:
        concepts.setdefault(name, []).extend(losses)
    every = [value for _, losses in per_image for value in losses]
    return ValidationResult(
        step, epoch, epoch_step, _mean(every), ranges, {name: _mean(v) for name, v in concepts.items()}
    )


def _mean(values: list[float]) -> float:
    total = 0.0
    for value in values:  # in order: the same sum in every run
        total += value
    return total / len(values) if values else math.nan


@dataclass(frozen=True)
class Checkpoint:
    kind: str  # "save", "backup" or "final"
    path: str
    step: int
    epoch: int
    epoch_step: int
    loss: float
    validated_at: int  # the step of the validation the loss is from
    run: str = ""
    run_identity: str = ""

    @property
    def label(self) -> str:
        return "the final model" if self.kind == "final" else progress_label(self.epoch, self.epoch_step, self.step)


@dataclass
class ValidationRecord:
    """`validation.json`: this workspace's validations and checkpoints with their losses, tagged with their run.

    The best checkpoint of a run is the one with the lowest loss among its own checkpoints and, when it resumed from a
    backup, the earlier runs' checkpoints of the same config up to that backup's step that still exist.
    """

    path: Path
    run: str
    identity: str
    validations: list[dict] = field(default_factory=list)
    checkpoints: list[dict] = field(default_factory=list)
    best_of_runs: dict[str, dict] = field(default_factory=dict)
    resumed_at: int | None = None  # the step of the backup this run resumed from

    @classmethod
    def open(cls, workspace_root: Path, run: str, identity: str) -> tuple[ValidationRecord, str | None]:
        """The workspace's record (a new one when there is none); and a warning when the file cannot be read (it is
        moved aside and this run starts a new record)."""
        path = workspace_root / FILE_NAME
        record = cls(path, run, identity)
        if not path.exists():
            return record, None
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            record.validations = list(data["validations"])
            record.checkpoints = list(data["checkpoints"])
            record.best_of_runs = dict(data.get("best", {}))
            return record, None
        except (OSError, ValueError, KeyError, TypeError) as e:
            problem = f"{path} cannot be read ({type(e).__name__}: {e})"
        record.validations, record.checkpoints, record.best_of_runs = [], [], {}
        kept = path.with_name(f"{FILE_NAME}.unreadable")
        try:
            path.replace(kept)
        except OSError:
            return record, f"{problem}; this run starts a new record"
        return record, f"{problem}; it is kept as {kept.name} and this run starts a new record"

    def resumed(self, step: int) -> None:
        self.resumed_at = step

    def add_validation(self, result: ValidationResult) -> None:
        self.validations.append({"run": self.run, "run_identity": self.identity, **asdict(result)})

    def add_checkpoint(self, checkpoint: Checkpoint) -> Checkpoint | None:
        """Record a checkpoint; the run's best when this changed it, else None."""
        before = self.best()
        entry = asdict(checkpoint)
        entry.update(run=self.run, run_identity=self.identity)
        self.checkpoints.append(entry)
        best = self.best()
        if best is not None:
            self.best_of_runs[self.run] = asdict(best)
        changed = best is not None and (before is None or (best.path, best.step) != (before.path, before.step))
        return best if changed else None

    def best(self) -> Checkpoint | None:
        candidates = [Checkpoint(**c) for c in self.checkpoints if self._in_this_run(c) and Path(c["path"]).exists()]
        candidates = [c for c in candidates if math.isfinite(c.loss)]
        # The lowest loss; among equal ones the earliest (fewer steps for the same result).
        return min(candidates, key=lambda c: (c.loss, c.step), default=None)

    def best_validation(self) -> ValidationResult | None:
        """The run's lowest validation loss so far, by the same rule as `best`."""
        entries = [v for v in self.validations if self._in_this_run(v) and math.isfinite(v["loss"])]
        best = min(entries, key=lambda v: (v["loss"], v["step"]), default=None)
        if best is None:
            return None
        return ValidationResult(**{f.name: best[f.name] for f in fields(ValidationResult)})

    def _in_this_run(self, entry: dict) -> bool:
        if entry.get("run") == self.run:
            return True
        earlier = self.resumed_at is not None and entry.get("run_identity") == self.identity
        return earlier and entry.get("step", math.inf) <= self.resumed_at

    def write(self) -> None:
        atomic_write_json(
            self.path,
            {
                "format": FORMAT_VERSION,
                "validations": self.validations,
                "checkpoints": self.checkpoints,
                "best": self.best_of_runs,
            },
        )
