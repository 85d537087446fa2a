"""A run of one process calls the group as several processes do: `SingleProcess` stands in for `Distributed` (its
collectives return their input) and the control for the synced commands."""

from __future__ import annotations

import torch

from onetrainer.training.control import TrainingControl
from onetrainer.training.distributed import SingleProcess


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
