"""`ddp_worker.py` (its faults) for the sharded tests, and two more: SHARD_TEST_SIZES=<folder>, where each rank writes
how much of the trained weights and of the optimizer's state it holds after the first step, and every move of a whole
part between the device and the host before it (`rank<N>.json`);
SHARD_TEST_DISK_FULL=1, rank 0's final save fails as on a full disk."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

from tests.training import ddp_worker
from tests.training.ddp_worker import RANK, main, trainer_module

_train_step = trainer_module.Trainer.train_step


def train_step(self, batches):
    loss = _train_step(self, batches)
    folder = os.environ.get("SHARD_TEST_SIZES")
    if folder and self.progress.global_step == 0 and self.sharding is not None:
        sizes = self.sharding.sizes(self.optimization.optimizer)
        report = {**dataclasses.asdict(sizes), "moves": self.placement.moves}  # each part moved whole, and where
        Path(folder, f"rank{RANK}.json").write_text(json.dumps(report), encoding="utf-8")
    return loss


trainer_module.Trainer.train_step = train_step

if os.environ.get("SHARD_TEST_DISK_FULL") and RANK == 0:
    import errno

    from onetrainer.methods.finetune import FineTuneMethod

    def save_output(self, destination):
        raise OSError(errno.ENOSPC, "No space left on device", str(destination))

    FineTuneMethod.save_output = save_output
assert ddp_worker.train_step is not None  # its faults stay installed beneath this

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
