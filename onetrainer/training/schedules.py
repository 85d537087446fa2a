"""Learning-rate schedules as plain formulas of the step, so each can be tested against its definition.

A step is one optimizer update. `factor(step)` multiplies each parameter group's learning rate for the update with
0-based index `step`; warmup rises linearly to 1 over the warmup steps, every schedule is then floored by the
minimum factor: factor = min + (1 - min) * f.
"""

from __future__ import annotations

import ast
import importlib
import math
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING

from onetrainer.config.enums import LearningRateScheduler

if TYPE_CHECKING:
    from onetrainer.config import TrainConfig

REX_D = 0.9  # REX's curvature: (1 - p) / ((1 - d) + d (1 - p)), arXiv 2107.04197 with d = 0.9 as OneTrainer uses


@dataclass(frozen=True)
class Schedule:
    kind: LearningRateScheduler
    total_steps: int
    warmup_steps: int
    min_factor: float = 0.0
    cycles: float = 1.0

    def factor(self, step: int) -> float:
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        span = max(1, self.total_steps - self.warmup_steps)
        p = min(1.0, max(0.0, (step - self.warmup_steps) / span))
        return self.min_factor + (1.0 - self.min_factor) * self._shape(p)

    def _shape(self, p: float) -> float:
        kind = self.kind
        if kind is LearningRateScheduler.LINEAR:
            return 1.0 - p
        if kind is LearningRateScheduler.COSINE:
            return 0.5 * (1.0 + math.cos(math.pi * p))
        if kind is LearningRateScheduler.COSINE_WITH_RESTARTS:
            # Smooth restarts: the cosine goes back up `cycles` times over the run.
            return 0.5 * (1.0 + math.cos(2.0 * math.pi * self.cycles * p))
        if kind is LearningRateScheduler.COSINE_WITH_HARD_RESTARTS:
            if p >= 1.0:
                return 0.0
            return 0.5 * (1.0 + math.cos(math.pi * ((self.cycles * p) % 1.0)))
        if kind is LearningRateScheduler.REX:
            return (1.0 - p) / ((1.0 - REX_D) + REX_D * (1.0 - p))
        return 1.0  # CONSTANT (ADAFACTOR and CUSTOM are built elsewhere)


def warmup_steps_of(value: float, total_steps: int) -> int:
    """A warmup above 1 is a number of steps; between 0 and 1 a fraction of the total."""
    if value <= 0:
        return 0
    if value < 1:
        return round(value * total_steps)
    return int(value)


def build_lr_scheduler(optimizer, config: TrainConfig, total_steps: int, steps_per_epoch: int, last_step: int = 0):
    """The torch scheduler for `config`; it is stepped once per optimizer step and resumes at `last_step`."""
    import torch

    from onetrainer.training.optim import optimizer_spec

    kind = config.learning_rate_scheduler
    warmup = warmup_steps_of(config.learning_rate_warmup_steps, total_steps)
    if optimizer_spec(config.optimizer.optimizer).schedule_free:
        warmup = 0  # the optimizer warms up itself
    if kind is LearningRateScheduler.ADAFACTOR:
        from transformers.optimization import AdafactorSchedule

        return AdafactorSchedule(optimizer, initial_lr=config.learning_rate)
    if kind is LearningRateScheduler.CUSTOM:
        return _custom_scheduler(optimizer, config, total_steps, steps_per_epoch, warmup)
    schedule = Schedule(kind, total_steps, warmup, config.learning_rate_min_factor, config.learning_rate_cycles)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule.factor)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*lr_scheduler.step.*")  # fast-forwarding before any update is meant
        for _ in range(last_step):
            scheduler.step()
    return scheduler


def _custom_scheduler(optimizer, config: TrainConfig, total_steps: int, steps_per_epoch: int, warmup: int):
    import torch

    path = (config.custom_learning_rate_scheduler or "").strip()
    module_name, _, class_name = path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError, ValueError) as e:
        raise ValueError(f"custom_learning_rate_scheduler: cannot import '{path}': {e}") from None
    placeholders = {
        "%LR%": config.learning_rate,
        "%EPOCHS%": config.epochs,
        "%STEPS_PER_EPOCH%": steps_per_epoch,
        "%TOTAL_STEPS%": total_steps,
        "%SCHEDULER_STEPS%": max(1, total_steps - warmup),
    }
    kwargs = {}
    for param in config.scheduler_params:
        raw = param.value.strip()
        if raw in placeholders:
            kwargs[param.key] = placeholders[raw]
            continue
        try:
            kwargs[param.key] = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            raise ValueError(f"scheduler_params: the value of '{param.key}' is not a Python literal: {raw}") from None
    main = cls(optimizer, **kwargs)
    if warmup <= 0:
        return main
    ramp = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: (s + 1) / warmup)
    return torch.optim.lr_scheduler.SequentialLR(optimizer, [ramp, main], milestones=[warmup])
