"""Data-parallel training over torch.distributed, one process per GPU, started by `torchrun`.

`torchrun --nproc_per_node N scripts/train.py …` (or several machines with `--nnodes/--node_rank/--rdzv_*`) sets
RANK, WORLD_SIZE, LOCAL_RANK and the rendezvous address; `from_environment` joins the group (NCCL on CUDA, gloo on a
CPU and on Windows, whose torch has no NCCL). The trainer stays one loop with small hooks:

- the epoch plan is made at the global batch (`batch_size` × processes), so buckets stay whole per step and every
  image is kept globally; each rank loads its slice of every batch (`TrainingData.local_part`);
- every random draw of a step is made at the global batch's size from the step's generator and sliced
  (`GlobalDraws`): the noise a sample gets depends on its place in the global batch, not on the rank, so N processes
  at batch b train what one process trains at batch N·b (up to rounding of the all-reduce);
- after the backward pass one small all-reduce (`sync`) carries every rank's status (failed), the commands (stop,
  sample, save, backup: rank 0's window or any rank's signal) and the loss; then the trainable parameters' gradients
  are averaged with bucketed all-reduces in `gradient_reduce_precision` (LoRA, embeddings and fine-tunes alike:
  only trainable parameters have gradients, so no DDP wrapper is needed and the modules stay unwrapped for saving,
  sampling and peft);
- a rank that fails (an exception, a NaN loss) says so at the next `sync` and sends its message; the others raise
  `RankFailed` with it, so the run ends on every rank within one step with the failing rank's words;
- sampling, saving, backups, validation, TensorBoard and console output happen on rank 0 only.

This module never reads the config: joining takes the devices the ranks train on (`RankDevices`) and the reduce its
`ReduceSettings`, both small frozen objects built from the config once (`processes.py`, `settings.py`).

A run of one process holds `SingleProcess`, the same interface with no one to meet (rank 0 of 1), so the trainer calls
the group's methods without asking whether there is one.
"""

from __future__ import annotations

import contextlib
import datetime
import os
from dataclasses import dataclass
from typing import NoReturn

import torch

from onetrainer.training.control import TrainingControl
from onetrainer.training.stochastic_rounding import round_stochastically

COMMANDS = ("sample", "save", "backup")
TIMEOUT_ENV = "ONETRAINER_DIST_TIMEOUT"  # seconds a rank waits for the others in one collective (default 30 min)


class RankFailed(RuntimeError):
    """Another rank failed; the message is its own."""


class StoppedByRank(Exception):
    """A rank stopped before the first step; every rank ends without writing anything."""


def world_size_from_environment() -> int:
    return int(os.environ.get("WORLD_SIZE", "1") or 1)


def device_indexes(setting: str) -> list[int]:
    """`device_indexes` ("0,1,3"): which GPU each local rank takes; empty means 0, 1, 2, …"""
    from onetrainer.training.device_lists import device_index_list

    try:
        return device_index_list(setting)
    except ValueError as error:
        raise ValueError(f"device_indexes: {error}") from None


@dataclass(frozen=True)
class RankDevices:
    """Where the ranks train: on the GPUs when `train_device` is a CUDA device (and there is one), local rank i on
    the i-th of `device_indexes` ("0,1,3"; empty: every visible GPU in order), else on the CPU."""

    train_device: str
    device_indexes: str


@dataclass(frozen=True)
class ReduceSettings:
    """How the trainable gradients are averaged over the ranks: in float32 or each weight's own dtype
    (`in_float32`), rounded back to bfloat16 weights stochastically (`stochastic`), in buckets of `bucket_bytes`
    (0: one parameter at a time) whose all-reduces are launched before the first is waited for (`asynchronous`)."""

    in_float32: bool
    stochastic: bool
    bucket_bytes: int
    asynchronous: bool


@dataclass
class SyncResult:
    stop: bool
    commands: set[str]
    loss: float  # the mean of the ranks' losses
    failed: bool


class SyncedControl:
    """The trainer's view of the commands: what the last `sync` decided, the same on every rank."""

    def __init__(self, local: TrainingControl) -> None:
        self.local = local
        self._stop = False
        self._pending: set[str] = set()

    @property
    def stop_requested(self) -> bool:
        return self._stop

    @property
    def abort_requested(self) -> bool:
        return self.local.abort_requested

    def take(self, command: str) -> bool:
        if command in self._pending:
            self._pending.discard(command)
            return True
        return False

    def update(self, result: SyncResult) -> None:
        self._stop = self._stop or result.stop
        self._pending |= result.commands


def collective_backend(use_cuda: bool) -> str:
    """NCCL for GPUs where torch has it; gloo on the CPU and for GPUs on Windows (torch's Windows builds have no NCCL;
    gloo all-reduces CUDA tensors too, more slowly)."""
    import torch.distributed as dist

    return "nccl" if use_cuda and dist.is_nccl_available() else "gloo"


class Distributed:
    def __init__(self, rank: int, world_size: int, local_rank: int, device: torch.device) -> None:
        self.rank, self.world_size, self.local_rank, self.device = rank, world_size, local_rank, device
        self.left = False  # this rank has said goodbye (failed or stopped): no more collectives

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    # -- the group ----------------------------------------------------------------------------------------------
    @classmethod
    def from_environment(cls, devices: RankDevices) -> Distributed | None:
        """Join torchrun's group when WORLD_SIZE > 1; None for a single-process run."""
        world = world_size_from_environment()
        if world <= 1:
            return None
        rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
        return cls.join(devices, rank, world, local_rank)

    @classmethod
    def join(
        cls, devices: RankDevices, rank: int, world: int, local_rank: int, init_method: str | None = None
    ) -> Distributed:
        """Join the group as `rank` of `world` (NCCL on CUDA, gloo on a CPU); `init_method` None reads torchrun's
        MASTER_ADDR / MASTER_PORT, the app's rank 0 (`launcher.py`) gives its own tcp:// address."""
        import torch.distributed as dist

        use_cuda = devices.train_device.startswith("cuda") and torch.cuda.is_available()
        if use_cuda:
            indexes = device_indexes(devices.device_indexes) or list(range(torch.cuda.device_count()))
            if local_rank >= len(indexes):
                raise ValueError(
                    f"device_indexes: local rank {local_rank} has no GPU ({devices.device_indexes or 'all GPUs'} "
                    f"gives {len(indexes)}); start fewer processes per node"
                )
            device = torch.device("cuda", indexes[local_rank])
            torch.cuda.set_device(device)
        else:
            device = torch.device("cpu")
        timeout = datetime.timedelta(seconds=float(os.environ.get(TIMEOUT_ENV, "1800")))
        backend = collective_backend(use_cuda)
        if not dist.is_initialized():
            dist.init_process_group(
                backend,
                init_method=init_method,
                rank=rank,
                world_size=world,
                timeout=timeout,
                device_id=device if backend == "nccl" else None,
            )
        return cls(rank, world, local_rank, device)

    def close(self, finished: bool = True) -> None:
        """Leave the group. After a run every rank finished (`finished`), the ranks meet first, so no rank tears its
        side of the group down while another still has a collective in flight; after a failure a rank may be gone,
        and nobody waits for it."""
        import torch.distributed as dist

        if dist.is_initialized():
            if finished:
                with contextlib.suppress(Exception):  # a rank that ended meanwhile: the teardown goes on
                    dist.barrier()
            dist.destroy_process_group()

    def broadcast_object(self, value):
        import torch.distributed as dist

        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def all_gather_object(self, value) -> list:
        import torch.distributed as dist

        out: list = [None] * self.world_size
        dist.all_gather_object(out, value)
        return out

    # -- the per-step handshake ---------------------------------------------------------------------------------
    def sync(
        self, control: TrainingControl | None = None, loss: float = 0.0, failure: str | None = None, stop=False
    ) -> SyncResult:
        """One small all-reduce every rank makes at the same points: status, commands and the loss. A failure
        anywhere raises `RankFailed` (on the failing rank the caller re-raises its own error)."""
        import torch.distributed as dist

        flags = [1.0 if failure is not None else 0.0, 1.0 if stop else 0.0]
        if control is not None:
            flags[1] = max(flags[1], 1.0 if control.stop_requested else 0.0)
            flags += [1.0 if control.take(c) else 0.0 for c in COMMANDS]
        else:
            flags += [0.0] * len(COMMANDS)
        status = torch.tensor([*flags, loss], dtype=torch.float64, device=self._collective_device())
        dist.all_reduce(status)
        values = status.cpu().tolist()
        result = SyncResult(
            values[1] > 0,
            {c for c, v in zip(COMMANDS, values[2:5]) if v > 0},
            values[5] / self.world_size,
            values[0] > 0,
        )
        if result.failed:
            self.left = True
            messages = self.all_gather_object(failure)
            if failure is None:
                rank, message = next((r, m) for r, m in enumerate(messages) if m is not None)
                raise RankFailed(f"rank {rank} of {self.world_size} failed: {message}")
        return result

    def leave(self, failure: str | None = None) -> None:
        """Say goodbye at the others' next `sync` (this rank failed or stopped early); once."""
        if self.left:
            return
        self.left = True
        with contextlib.suppress(Exception):  # the others may be gone already; this rank ends either way
            self.sync(failure=failure, stop=failure is None)

    def barrier(self) -> None:
        """A `sync` that ends every rank early when one stopped."""
        if self.sync().stop:
            self.left = True
            raise StoppedByRank

    def _collective_device(self) -> torch.device:
        return self.device if self.device.type == "cuda" else torch.device("cpu")

    # -- gradients ----------------------------------------------------------------------------------------------
    def average_gradients(self, params: list[torch.nn.Parameter], settings: ReduceSettings) -> None:
        """Average the trainable parameters' gradients over the ranks, as `settings` say (in float32 or the weights'
        dtype, in buckets launched together or one at a time). A parameter no rank gave a gradient keeps none (an
        optimizer treats that differently from a zero gradient)."""
        import torch.distributed as dist

        stochastic = settings.stochastic
        by_dtype: dict[torch.dtype, list[torch.nn.Parameter]] = {}
        for p in params:
            dtype = torch.float32 if settings.in_float32 else p.dtype
            by_dtype.setdefault(dtype, []).append(p)
        limit = settings.bucket_bytes
        pending = []
        for dtype, group in by_dtype.items():
            for bucket in _buckets(group, limit, dtype):
                flat = torch.cat(
                    [(p.grad if p.grad is not None else torch.zeros_like(p)).to(dtype).reshape(-1) for p in bucket]
                    + [
                        torch.tensor(
                            [0.0 if p.grad is None else 1.0 for p in bucket], dtype=dtype, device=bucket[0].device
                        )
                    ]
                )
                work = dist.all_reduce(flat, async_op=settings.asynchronous)
                pending.append((work, flat, bucket))
                if not settings.asynchronous:
                    self._unflatten(flat, bucket, stochastic)
                    pending.pop()
        for work, flat, bucket in pending:
            work.wait()
            self._unflatten(flat, bucket, stochastic)

    def _unflatten(self, flat: torch.Tensor, bucket: list[torch.nn.Parameter], stochastic: bool) -> None:
        flat.div_(self.world_size)
        present = flat[-len(bucket) :]
        offset = 0
        for p, has in zip(bucket, present.tolist()):
            value = flat[offset : offset + p.numel()].view_as(p)
            offset += p.numel()
            if has <= 0:
                p.grad = None
                continue
            p.grad = stochastic_round(value, p.dtype) if stochastic else value.to(p.dtype)


def _buckets(params: list[torch.nn.Parameter], limit_bytes: int, dtype: torch.dtype):
    """Groups of parameters of at most `limit_bytes` in `dtype` (one parameter each when `limit_bytes` is 0)."""
    size = torch.tensor([], dtype=dtype).element_size()
    bucket: list[torch.nn.Parameter] = []
    used = 0
    for p in params:
        if bucket and (limit_bytes == 0 or used + p.numel() * size > limit_bytes or p.device != bucket[0].device):
            yield bucket
            bucket, used = [], 0
        bucket.append(p)
        used += p.numel() * size
    if bucket:
        yield bucket


def stochastic_round(value: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float32 → bfloat16 with stochastic rounding (unbiased on average); other targets round to nearest."""
    if dtype != torch.bfloat16 or value.dtype != torch.float32:
        return value.to(dtype)
    return round_stochastically(value)


class GlobalDraws:
    """A step's random draws at the global batch's size, sliced to this rank's samples: sample i of the global batch
    gets the same noise, timestep and dropout whichever rank trains it."""

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank, self.world_size = rank, world_size

    def size(self, local: int) -> int:
        return local * self.world_size

    def mine(self, drawn: torch.Tensor) -> torch.Tensor:
        if self.world_size == 1:  # the whole batch is this process's (no slice: one op less per draw and step)
            return drawn
        local = drawn.shape[0] // self.world_size
        return drawn[self.rank * local : (self.rank + 1) * local]

    def like(self, tensor: torch.Tensor) -> torch.Tensor:
        """An uninitialised CPU tensor shaped like the global batch of `tensor` (for draws that take a shape)."""
        return torch.empty((tensor.shape[0] * self.world_size, *tensor.shape[1:]), dtype=tensor.dtype)


SINGLE = GlobalDraws(0, 1)


class SingleProcess:
    """A run of one process with `Distributed`'s interface (rank 0 of 1), so the trainer calls it unconditionally.

    Nothing is exchanged: a collective returns its input untouched (no tensor, no copy), a `sync` reports this
    process's own stop and takes no command (one process reads its commands live: `TrainingControl.update` keeps
    nothing), and leaving only notes it.
    """

    rank, world_size, local_rank = 0, 1, 0
    is_main = True

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.left = False

    def close(self, finished: bool = True) -> None:
        pass

    def broadcast_object(self, value):
        return value

    def all_gather_object(self, value) -> list:
        return [value]

    def sync(
        self, control: TrainingControl | None = None, loss: float = 0.0, failure: str | None = None, stop=False
    ) -> SyncResult:
        stopped = stop or (control is not None and control.stop_requested)
        return SyncResult(stopped, set(), loss, failure is not None)

    def leave(self, failure: str | None = None) -> None:
        self.left = True

    def barrier(self) -> None:
        pass

    def average_gradients(self, params: list[torch.nn.Parameter], settings: ReduceSettings) -> None:
        """One process's gradients are the average already."""


def end_worker_process(code: int) -> NoReturn:
    """End one rank's process (started by torchrun or the app) once its run is over, without the interpreter's
    teardown. The threads torch's process group and autograd started outlive the run, and one that still holds a
    Python object while the interpreter is being finalized aborts the process (SIGABRT, "terminate called without an
    active exception"): torchrun then reports a finished run as failed and stops the other ranks. Everything the run
    writes is written and closed by now; the log handlers and the output streams are flushed here."""
    import logging
    import sys

    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)
