"""`scripts/train.py` under torchrun for the multi-process tests, with faults the test asks for through the
environment: DDP_TEST_NAN="rank:step" (that rank's loss becomes NaN at that step), DDP_TEST_STOP="step" (rank 0's
Stop is pressed after that step)."""

from __future__ import annotations

import os
import sys

from onetrainer.cli.train import main
from onetrainer.training import trainer as trainer_module

RANK = int(os.environ.get("RANK", "0"))
_batch_loss = trainer_module.Trainer.batch_loss
_train_step = trainer_module.Trainer.train_step


def batch_loss(self, batch, generator, timesteps=None):
    loss = _batch_loss(self, batch, generator, timesteps)
    rank, step = (int(v) for v in os.environ.get("DDP_TEST_NAN", "-1:-1").split(":"))
    if rank == RANK and self.progress.global_step == step:
        return loss * float("nan")
    return loss


def train_step(self, batches):
    loss = _train_step(self, batches)
    if RANK == 0 and self.progress.global_step + 1 == int(os.environ.get("DDP_TEST_STOP", "-1")):
        self.control.local.request_stop()  # as the window's Stop button would, on rank 0 only
    return loss


trainer_module.Trainer.batch_loss = batch_loss
trainer_module.Trainer.train_step = train_step

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
