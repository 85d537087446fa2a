"""What the config's time settings mean: when periodic actions fire ("every N epochs / steps / seconds / minutes /
hours", with "skip the first N") and when a part's "stop training after N epochs / steps" is reached. Beside the
config's `TimeUnit` (plain Python, no torch), for the trainer and the methods that read these settings.

Epoch actions fire at the end of every N-th epoch, step actions after every N-th optimizer step, time actions once
N units of wall-clock time have passed since the action last ran. Nothing fires at step 0. "Skip the first N" counts
in the interval's own unit: with "every 1 epoch, skip first 3" the first action is at the end of epoch 4.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from onetrainer.config.enums import TimeUnit


@dataclass
class Interval:
    every: int
    unit: TimeUnit
    skip_first: int = 0
    clock: callable = time.monotonic  # type: ignore[valid-type]
    _started: float = field(default=0.0, init=False)
    _last: float = field(default=0.0, init=False)

    def start(self) -> None:
        self._started = self._last = self.clock()

    @property
    def enabled(self) -> bool:
        return self.unit is not TimeUnit.NEVER and (self.every > 0 or self.unit is TimeUnit.ALWAYS)

    def after_step(self, global_step: int) -> bool:
        """Called after each optimizer step (`global_step` counts the steps done)."""
        if not self.enabled or global_step <= 0:
            return False
        if self.unit is TimeUnit.ALWAYS:
            return True
        if self.unit is TimeUnit.STEP:
            return global_step % self.every == 0 and global_step > self.skip_first
        if self.unit.is_time:
            now = self.clock()
            if now - self._started <= self.skip_first * self.unit.seconds:
                return False
            if now - self._last >= self.every * self.unit.seconds:
                self._last = now
                return True
        return False

    def after_epoch(self, epochs_done: int) -> bool:
        """Called at the end of each epoch (`epochs_done` counts the finished epochs)."""
        if not self.enabled or self.unit is not TimeUnit.EPOCH or epochs_done <= 0:
            return False
        return epochs_done % self.every == 0 and epochs_done > self.skip_first


def stop_after_reached(limit: int | None, unit: TimeUnit, global_step: int, epochs_done: int) -> bool:
    """Whether a part's "stop training after N epochs/steps" has been reached."""
    if limit is None or unit is TimeUnit.NEVER:
        return False
    if unit is TimeUnit.EPOCH:
        return epochs_done >= limit
    if unit is TimeUnit.STEP:
        return global_step >= limit
    return False
