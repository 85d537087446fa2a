"""`ddp_worker.py` (its faults) for the sharded tests, and two more: SHARD_TEST_SIZES=<folder>, where each rank writes
how much of the trained weights and of the optimizer's state it holds after the first step, and every move of a whole
part between the device and the host before it (`rank<N>.json`);
SHARD_TEST_DISK_FULL=1, rank 0's final save fails as on a full disk;
SHARD_TEST_LOAD=<folder>, where each rank writes how it loaded the model (`load-rank<N>.json`): when its read began and
ended and when it let go of weights (`time.time()`), the bytes of the parts to shard it read, held once every process
had read, and held as the sharding began."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from pathlib import Path

from onetrainer.training import sharding as sharding_module
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

LOADING: dict = {"released": []}


def _held(model, parts) -> int:
    """Bytes of the weights of `parts` this process holds (not on the meta device)."""
    return sum(p.numel() * p.element_size() for n in parts for p in model.part(n).parameters() if not p.is_meta)


_load_in_turns = trainer_module.load_in_turns
_without_weights = sharding_module.without_weights
_shard = trainer_module.Trainer._shard


def load_in_turns(dist, load, sharded):
    def timed():
        LOADING["start"] = time.time()
        model = load()
        LOADING["read"], LOADING["whole"] = time.time(), _held(model, sharded(model))
        return model

    model = _load_in_turns(dist, timed, sharded)
    LOADING["after_turns"] = _held(model, sharded(model))
    return model


def without_weights(module):
    _without_weights(module)
    LOADING["released"].append(time.time())


def shard(self):
    folder = os.environ.get("SHARD_TEST_LOAD")
    if folder:
        record = {**LOADING, "before_shard": _held(self.model, self.method.trained_parts())}
        Path(folder, f"load-rank{RANK}.json").write_text(json.dumps(record), encoding="utf-8")
    return _shard(self)


trainer_module.load_in_turns = load_in_turns
sharding_module.without_weights = without_weights
trainer_module.Trainer._shard = shard

if os.environ.get("SHARD_TEST_DISK_FULL") and RANK == 0:
    import errno

    from onetrainer.methods.finetune import FineTuneMethod

    def save_output(self, destination):
        raise OSError(errno.ENOSPC, "No space left on device", str(destination))

    FineTuneMethod.save_output = save_output
assert ddp_worker.train_step is not None  # its faults stay installed beneath this

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
