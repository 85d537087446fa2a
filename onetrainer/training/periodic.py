"""When the loop's periodic actions run: validation, samples, backups and saves, each at its own interval."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from onetrainer.config.timing import Interval

if TYPE_CHECKING:
    from onetrainer.config import TrainConfig
    from onetrainer.training.distributed import Distributed, SingleProcess


class AgreedInterval:
    """An interval whose firing after a step rank 0's clock decides, the same on every rank: validation makes backups
    and saves collective, and a wall-clock interval may fire on one rank and not another."""

    def __init__(self, interval: Interval, ranks: Distributed | SingleProcess) -> None:
        self.interval, self.ranks = interval, ranks

    def after_step(self, global_step: int) -> bool:
        return bool(self.ranks.broadcast_object(self.interval.after_step(global_step)))

    def after_epoch(self, epochs_done: int) -> bool:
        return self.interval.after_epoch(epochs_done)


@dataclass
class Periodic:
    validate: Interval | AgreedInterval
    sample: Interval
    backup: Interval | AgreedInterval
    save: Interval | AgreedInterval

    @classmethod
    def start(cls, config: TrainConfig, validating: bool, ranks: Distributed | SingleProcess) -> Periodic:
        """The intervals of `config`, their clocks started now (validation never runs without its images)."""
        sample = Interval(config.sample_after, config.sample_after_unit, config.sample_skip_first)
        backup = Interval(config.backup_after, config.backup_after_unit)
        save = Interval(config.save_every, config.save_every_unit, config.save_skip_first)
        validate = Interval(config.validate_after if validating else 0, config.validate_after_unit)
        for interval in (sample, backup, save, validate):
            interval.start()

        def agreed(interval: Interval) -> Interval | AgreedInterval:
            # Only a wall-clock interval can differ between ranks, and only validation makes the action collective
            # (samples are rank 0's alone).
            return AgreedInterval(interval, ranks) if validating and interval.unit.is_time else interval

        return cls(agreed(validate), sample, agreed(backup), agreed(save))
