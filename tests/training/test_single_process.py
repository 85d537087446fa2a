"""A run of one process calls the group as several processes do: `SingleProcess` stands in for `Distributed` (its
collectives return their input), the control for the synced commands, and the periodic intervals that several ranks
must agree on are asked the same way."""

from __future__ import annotations

import torch

from onetrainer.config import config_from_dict
from onetrainer.config.enums import TimeUnit
from onetrainer.training.control import TrainingControl
from onetrainer.training.distributed import SingleProcess
from onetrainer.training.periodic import AgreedInterval, Periodic


def test_one_process_exchanges_nothing_and_reads_its_commands_live():
    group = SingleProcess(torch.device("cpu"))
    assert (group.rank, group.world_size, group.is_main, group.left) == (0, 1, True, False)
    value = {"a": [1.0]}
    assert group.broadcast_object(value) is value and group.all_gather_object(value) == [value]
    control = TrainingControl()
    control.request_sample()
    result = group.sync(control.local, 1.25)
    assert (result.stop, result.commands, result.loss, result.failed) == (False, set(), 1.25, False)
    control.update(result)
    assert control.take("sample")  # the sync took no command: the loop takes it, as one process always did
    control.request_stop()
    assert group.sync(control.local).stop and control.local is control
    gradient = torch.ones(3)
    parameter = torch.nn.Parameter(torch.zeros(3))
    parameter.grad = gradient
    group.average_gradients([parameter], None)
    group.barrier()
    assert parameter.grad is gradient  # untouched: no copy, no division
    group.leave(failure="boom")
    assert group.left


def test_only_wall_clock_intervals_under_validation_are_agreed():
    config, _ = config_from_dict(
        {"backup_after": 10, "backup_after_unit": "MINUTE", "save_every": 2, "save_every_unit": "STEP",
         "validate_after": 1, "validate_after_unit": "SECOND"}
    )  # fmt: skip
    due = Periodic.start(config, True, SingleProcess(torch.device("cpu")))
    assert isinstance(due.backup, AgreedInterval) and isinstance(due.validate, AgreedInterval)
    assert not isinstance(due.save, AgreedInterval)
    assert due.save.after_step(2) and not due.save.after_step(3)
    assert not due.backup.after_step(1)  # ten minutes have not passed
    plain = Periodic.start(config, False, SingleProcess(torch.device("cpu")))
    assert not isinstance(plain.backup, AgreedInterval) and plain.validate.unit is TimeUnit.SECOND
    assert not plain.validate.after_step(1)  # no validation without its images
