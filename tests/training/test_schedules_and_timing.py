"""LR schedules against their formulas, and when periodic actions fire."""

from __future__ import annotations

import math

import pytest
import torch

from onetrainer.config import TrainConfig
from onetrainer.config.enums import LearningRateScheduler as LRS
from onetrainer.config.enums import TimeUnit
from onetrainer.config.timing import Interval, stop_after_reached
from onetrainer.training.schedules import REX_D, Schedule, build_lr_scheduler, warmup_steps_of


@pytest.mark.parametrize(
    ("kind", "formula"),
    [
        (LRS.CONSTANT, lambda p: 1.0),
        (LRS.LINEAR, lambda p: 1 - p),
        (LRS.COSINE, lambda p: 0.5 * (1 + math.cos(math.pi * p))),
        (LRS.COSINE_WITH_RESTARTS, lambda p: 0.5 * (1 + math.cos(2 * math.pi * 2 * p))),
        (LRS.COSINE_WITH_HARD_RESTARTS, lambda p: 0.5 * (1 + math.cos(math.pi * ((2 * p) % 1)))),
        (LRS.REX, lambda p: (1 - p) / ((1 - REX_D) + REX_D * (1 - p))),
    ],
)
def test_schedules_follow_their_formulas(kind, formula):
    schedule = Schedule(kind, total_steps=110, warmup_steps=10, min_factor=0.1, cycles=2)
    for step in (0, 4, 9):
        assert schedule.factor(step) == pytest.approx((step + 1) / 10)  # linear warmup
    for step in (10, 35, 60, 85, 109):
        p = (step - 10) / 100
        assert schedule.factor(step) == pytest.approx(0.1 + 0.9 * formula(p)), step


def test_warmup_can_be_a_fraction_of_the_total():
    assert warmup_steps_of(0.1, 200) == 20
    assert warmup_steps_of(50, 200) == 50
    assert warmup_steps_of(0, 200) == 0


def test_torch_scheduler_resumes_where_it_stopped():
    config = TrainConfig(learning_rate=1.0, learning_rate_scheduler=LRS.COSINE, learning_rate_warmup_steps=0)
    param = torch.nn.Parameter(torch.zeros(1))

    def rates(last_step: int, count: int) -> list[float]:
        optimizer = torch.optim.SGD([param], lr=1.0)
        scheduler = build_lr_scheduler(optimizer, config, total_steps=20, steps_per_epoch=10, last_step=last_step)
        out = []
        for _ in range(count):
            out.append(optimizer.param_groups[0]["lr"])
            optimizer.step()
            scheduler.step()
        return out

    assert rates(0, 20)[12:] == pytest.approx(rates(12, 8))


def test_step_interval_and_skip_first():
    every = Interval(3, TimeUnit.STEP, skip_first=4)
    assert [s for s in range(0, 13) if every.after_step(s)] == [6, 9, 12]
    assert not Interval(0, TimeUnit.STEP).after_step(5)
    assert not Interval(2, TimeUnit.NEVER).after_step(2)


def test_epoch_interval():
    every = Interval(2, TimeUnit.EPOCH, skip_first=2)
    assert [e for e in range(0, 9) if every.after_epoch(e)] == [4, 6, 8]
    assert not every.after_step(4)


def test_time_interval_uses_the_clock():
    now = [0.0]
    every = Interval(2, TimeUnit.MINUTE, skip_first=1, clock=lambda: now[0])
    every.start()
    fired = []
    for t in range(0, 400, 10):
        now[0] = float(t)
        if every.after_step(1):
            fired.append(t)
    assert fired == [120, 240, 360]


def test_stop_after():
    assert stop_after_reached(3, TimeUnit.EPOCH, global_step=100, epochs_done=3)
    assert not stop_after_reached(3, TimeUnit.EPOCH, global_step=100, epochs_done=2)
    assert stop_after_reached(10, TimeUnit.STEP, global_step=10, epochs_done=0)
    assert not stop_after_reached(None, TimeUnit.STEP, global_step=10, epochs_done=0)
    assert not stop_after_reached(1, TimeUnit.NEVER, global_step=10, epochs_done=9)
