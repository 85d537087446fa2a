"""Sharded fine-tunes (`multi_gpu_mode` SHARDED): the trained parts split over the processes with torch's FSDP2.

Each trained part (the denoiser, and a text encoder that trains) gets `torch.distributed.fsdp.fully_shard` on every
block the family declares for it (`Family.layer_blocks`, in execution order), then on the part itself, so a block's
weights are gathered on every process just before it computes and freed after; between steps each process holds 1/N
of the trained weights, of their gradients (reduce-scattered, averaged over the processes, in the backward pass) and
of the optimizer's state, which the optimizer builds on the sharded (DTensor) parameters. A part without declared
blocks is one unit (gathered whole while it computes; its gradients and optimizer state are still split).

Loading: the processes read the model one at a time, rank 0 last (`load_in_turns`); each other process lets go of the
weights of the parts it will shard (`without_weights`: empty parameters on the meta device) before the next reads, and
rank 0 sends every process its shards when they are cut (`shard_parts(from_rank0=True)`: torch's
`set_model_state_dict` with `broadcast_from_rank0`). The machine holds one whole model at a time, not one per process.

The numbers: `ShardSettings` (`settings.shard_settings`) gives the dtype the blocks are gathered and computed in (a
16-bit train dtype over float32 weights; else the weights' own), the dtype gradients are averaged in (float32, or the
computed one, after `gradient_reduce_precision`) and FSDP2's CPU offload of the shards.

What is written: a backup is `torch.distributed.checkpoint` (DCP) shards of the trained parts and the optimizer, one
file per process, written by every process into a folder rank 0 names, which rank 0 then moves into the backup folder
as it writes the rest (`checkpoint.write_backup`). It resumes on any number of processes (DCP reads each process's
share of every tensor from the shards that hold it: `ShardedParts.read_state`), or unsharded in one process, with no
process group (`read_state_whole`); an unsharded run's backup resumes sharded too (`ShardedParts.read_whole_state`:
every process reads the full weights and optimizer state and keeps its shard). A saved model (the final one, the
intermediate saves) is an ordinary file: every process takes part in gathering the full weights into rank 0's CPU
memory (`get_model_state_dict(full_state_dict=True, cpu_offload=True)`), rank 0 puts them into a plain copy of each
part's module (built on the meta device before sharding, its weights assigned from the gathered ones) in the model
for the family's usual saving, which writes atomically, and puts the sharded part back. A rank that fails makes the
gather fail on every rank before anything is written.

This module never reads the config (`ShardSettings` is built in `settings.py`).
"""

from __future__ import annotations

import contextlib
import copy
import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from onetrainer.families.base import Family, LoadedModel
    from onetrainer.training.distributed import Distributed
    from onetrainer.training.ema import EMA

SHARDED_STATE = "sharded"  # the DCP folder inside a backup


@dataclass(frozen=True)
class ShardSettings:
    """How the sharded parts compute and exchange: `compute_dtype` is the dtype float32 weights are gathered and
    computed in (None: the weights' own), `reduce_dtype` the dtype gradients are averaged in (None: the computed
    one), `cpu_offload` keeps the shards in CPU memory (FSDP2's `CPUOffloadPolicy`)."""

    compute_dtype: torch.dtype | None
    reduce_dtype: torch.dtype | None
    cpu_offload: bool


@dataclass(frozen=True)
class ShardSizes:
    """This process's share of the trained weights and of the optimizer's state, in elements (local / whole)."""

    weights_local: int
    weights_whole: int
    optimizer_local: int
    optimizer_whole: int


class ShardedParts:
    """The trained parts of a run, sharded over the group; what saving, backups and resuming need of them."""

    def __init__(
        self,
        model: LoadedModel,
        parts: list[str],
        dist: Distributed,
        blocks: dict[str, int],
        skeletons: dict[str, torch.nn.Module],
    ) -> None:
        self.model, self.parts, self.dist = model, list(parts), dist
        self.blocks = blocks  # part → how many declared blocks were sharded on their own
        self._skeletons = skeletons  # rank 0's: each part's module on the meta device, for `plain_parts`

    # -- saving: the full weights on rank 0 ---------------------------------------------------------------------------
    def full_state(self) -> dict[str, dict[str, torch.Tensor]]:
        """Every process takes part; rank 0 gets each part's full state in CPU memory, the others empty dicts."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return {name: get_model_state_dict(self.model.part(name), options=options) for name in self.parts}

    @contextlib.contextmanager
    def plain_parts(self, states: dict[str, dict[str, torch.Tensor]]) -> Iterator[None]:
        """For the duration, rank 0's model holds plain modules with the full trained weights `states` (`full_state`,
        in CPU memory) in place of the sharded parts, for the family's saving. Rank 0's alone: no collective."""
        sharded = {name: self.model.parts[name] for name in self.parts}
        try:
            for name, state in states.items():
                plain = copy.deepcopy(self._skeletons[name])
                plain.load_state_dict(state, assign=True)
                _tie_again(plain)
                self.model.parts[name] = plain
            yield
        finally:
            self.model.parts.update(sharded)

    # -- computing outside training: samples, validation ---------------------------------------------------------------
    @contextlib.contextmanager
    def resharded(self) -> Iterator[None]:
        """Every sharded module holds its shards alone before and after the block. FSDP2 keeps a part's outermost
        weights gathered after a forward (the backward would gather them again), so after sampling or validating with
        the EMA's average swapped into the shards, the next training step would compute with the average; and the
        average swapped in while they are gathered would not be seen."""
        self._reshard()
        try:
            yield
        finally:
            self._reshard()

    def _reshard(self) -> None:
        from torch.distributed.fsdp import FSDPModule

        for name in self.parts:
            for module in self.model.part(name).modules():
                if isinstance(module, FSDPModule):
                    module.reshard()

    # -- backups: DCP shards ------------------------------------------------------------------------------------------
    def _wrapped(self) -> torch.nn.Module:
        """The sharded parts under one module (their names prefixed with the part's), for DCP's state dicts."""
        return torch.nn.ModuleDict({name: self.model.part(name) for name in self.parts})

    def write_state(self, folder: Path, optimizer: torch.optim.Optimizer, ema: EMA | None = None) -> Path:
        """Every process writes its shards of the trained weights, the optimizer's state and the EMA's average (when
        on) into a new folder in `folder`, named by rank 0 as a temporary one (a killed write leaves what the next run
        removes); its path."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        name = None
        if self.dist.is_main:
            name = f".{SHARDED_STATE}.pid{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp"
        target = Path(folder) / self.dist.broadcast_object(name)
        model_state, optimizer_state = get_state_dict(self._wrapped(), optimizer)
        state = {"model": model_state, "optimizer": optimizer_state}
        if ema is not None:
            state["ema"] = ema.shard_state()
        try:
            dcp.save(state, checkpoint_id=target)
        except BaseException:
            if self.dist.is_main:
                shutil.rmtree(target, ignore_errors=True)
            raise
        return target

    def read_state(self, folder: Path, optimizer: torch.optim.Optimizer | None, ema: EMA | None = None) -> None:
        """Load the shards a backup holds (`write_state`, by any number of processes: DCP reads each process's share
        of every tensor from the shards that hold it) into the sharded parts and the optimizer (every process; None:
        the weights alone, the optimizer starts fresh), and the EMA's average into `ema` (None: the backup holds
        none, or this run keeps none)."""
        targets = ema.shard_state() if ema is not None else None
        _load_shards(self._wrapped(), folder, optimizer, no_dist=False, ema=targets)
        if ema is not None:
            ema.load_shards(targets)

    def read_whole_state(
        self, states: dict[str, dict[str, torch.Tensor]], optimizer_state: dict | None, optimizer: torch.optim.Optimizer
    ) -> None:
        """Load an unsharded run's backup into the sharded parts (every process): `states` each part's full weights
        (every process reads them), `optimizer_state` the optimizer's `state_dict()` (its parameters numbered in the
        order of the groups, which a fine-tune builds alike sharded or not; None: the optimizer starts fresh). Each
        process keeps its shard of every tensor (`set_state_dict(full_state_dict=True)`)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_state_dict

        wrapped = self._wrapped()
        model_state = {f"{part}.{key}": value for part, state in states.items() for key, value in state.items()}
        missing = [n for n, p in wrapped.named_parameters() if p.requires_grad and n not in model_state]
        if missing:
            raise ValueError(f"it holds no weights for {', '.join(missing[:3])}{' …' if len(missing) > 3 else ''}")
        options = StateDictOptions(full_state_dict=True, strict=False)
        if optimizer_state is None:
            set_model_state_dict(wrapped, model_state, options=options)
            return
        names = {id(p): n for n, p in wrapped.named_parameters()}
        saved_groups = optimizer_state["param_groups"]
        name_of: dict[int, str] = {}
        for saved, group in zip(saved_groups, optimizer.param_groups, strict=True):
            if len(saved["params"]) != len(group["params"]):
                raise ValueError(
                    f"its optimizer group {group.get('name')!r} has {len(saved['params'])} weights, this run's "
                    f"{len(group['params'])}"
                )
            name_of.update((index, names[id(p)]) for index, p in zip(saved["params"], group["params"]))
        full = {
            "state": {name_of[index]: value for index, value in optimizer_state["state"].items()},
            "param_groups": [{**g, "params": [name_of[i] for i in g["params"]]} for g in saved_groups],
        }
        set_state_dict(wrapped, optimizer, model_state_dict=model_state, optim_state_dict=full, options=options)

    def agree(self, value):
        """Rank 0's `value` on every process (whether rank 0's write failed, and why)."""
        return self.dist.broadcast_object(value)

    # -- how much each process holds ----------------------------------------------------------------------------------
    def sizes(self, optimizer: torch.optim.Optimizer) -> ShardSizes:
        trained = [p for name in self.parts for p in self.model.part(name).parameters() if p.requires_grad]
        moments = [v for p in trained for v in optimizer.state.get(p, {}).values() if isinstance(v, torch.Tensor)]
        moments = [v for v in moments if v.dim() > 0]  # not the step counts
        return ShardSizes(
            sum(local_shard(p).numel() for p in trained),
            sum(p.numel() for p in trained),
            sum(local_shard(v).numel() for v in moments),
            sum(v.numel() for v in moments),
        )


def read_state_whole(
    parts: dict[str, torch.nn.Module], folder: Path, optimizer: torch.optim.Optimizer | None, ema: EMA | None = None
) -> None:
    """Load a sharded backup's shards (`ShardedParts.write_state`, by any number of processes) into unsharded `parts`
    (name → module, as the sharded run named them) and their optimizer (None: the weights alone), in this process
    alone: DCP reads every tensor whole, no collective (so one process without a process group, or each process of a
    data-parallel run, resumes it). `ema`: an unsharded EMA that reads the backup's average whole (None: the backup
    holds none, or this run keeps none)."""
    targets = ema.whole_targets() if ema is not None else None
    _load_shards(torch.nn.ModuleDict(parts), folder, optimizer, no_dist=True, ema=targets)


def _load_shards(
    wrapped: torch.nn.Module,
    folder: Path,
    optimizer: torch.optim.Optimizer | None,
    no_dist: bool,
    ema: dict[str, torch.Tensor] | None = None,
):
    """DCP's load of a backup's `model` (and `optimizer`) state into `wrapped`'s parameters (sharded or not) and
    `optimizer`, which `get_state_dict` gives the form the shards were written in (parameters named by their path);
    `ema`, the EMA's tensors to read its average into in place."""
    import warnings

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_state_dict,
        set_model_state_dict,
        set_state_dict,
    )

    if optimizer is None:
        state = {"model": get_model_state_dict(wrapped)}
    else:
        model_state, optimizer_state = get_state_dict(wrapped, optimizer)
        state = {"model": model_state, "optimizer": optimizer_state}
    if ema is not None:
        state["ema"] = ema
    with warnings.catch_warnings():  # one process without a group: DCP says it assumes so
        warnings.filterwarnings("ignore", message=".*single process")
        dcp.load(state, checkpoint_id=folder, no_dist=no_dist)
    if optimizer is None:
        set_model_state_dict(wrapped, state["model"])
    else:
        set_state_dict(wrapped, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])


def local_shard(tensor: torch.Tensor) -> torch.Tensor:
    """This process's shard of a DTensor, a view that writes through to it (a plain tensor is its own)."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def _tie_again(module: torch.nn.Module, groups: list[list[str]] | None = None) -> None:
    """Tied weights (a text encoder's token embedding held by two modules) are one parameter again after
    `load_state_dict(assign=True)` gave each name its own: every name takes the first name's parameter (the one FSDP2
    keeps as the shared weight's: the first met in module order). `groups`: `_tied_groups(module)` taken before the
    load (None: those `meta_skeleton` recorded)."""
    for names in getattr(module, "_tied_groups", ()) if groups is None else groups:
        first = module.get_parameter(names[0])
        for name in names[1:]:
            owner, _, attribute = name.rpartition(".")
            setattr(module.get_submodule(owner) if owner else module, attribute, first)


def _tied_groups(module: torch.nn.Module) -> list[list[str]]:
    """The names of each parameter `module` holds under several names, in module order."""
    groups: dict[int, list[str]] = {}
    for name, param in module.named_parameters(remove_duplicate=False):
        groups.setdefault(id(param), []).append(name)
    return [names for names in groups.values() if len(names) > 1]


def meta_skeleton(module: torch.nn.Module) -> torch.nn.Module:
    """A copy of `module` whose parameters are empty on the meta device (its buffers copied: non-persistent ones are
    in no state dict), to be given the full weights by `load_state_dict(assign=True)`."""
    memo: dict[int, object] = {}
    for param in module.parameters():
        memo[id(param)] = torch.nn.Parameter(torch.empty_like(param, device="meta"), param.requires_grad)
    skeleton = copy.deepcopy(module, memo)
    skeleton._tied_groups = _tied_groups(module)
    return skeleton


def without_weights(module: torch.nn.Module) -> None:
    """`module`'s parameters, in place, empty ones on the meta device (of the same shapes and dtypes, wanting gradients
    as they did, tied ones still one parameter); its buffers, and the module objects themselves (and whatever was set
    on them), kept. The weights are let go where nothing else holds them. `shard_parts` gives it its shards again."""
    empty: dict[int, torch.nn.Parameter] = {}
    for owner in module.modules():
        for name, param in list(owner._parameters.items()):
            if param is None or param.is_meta:
                continue
            if id(param) not in empty:
                empty[id(param)] = torch.nn.Parameter(torch.empty_like(param, device="meta"), param.requires_grad)
            owner._parameters[name] = empty[id(param)]


def give_back_freed_memory() -> None:
    """Freed host memory back to the operating system now: the C library keeps freed blocks below its mmap threshold
    (which grows as large blocks are freed) for the process's next allocations, where the next process to load a
    model needs them."""
    import ctypes
    import gc
    import sys

    gc.collect()
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6").malloc_trim(0)


def load_in_turns(
    dist: Distributed, load: Callable[[], LoadedModel], sharded: Callable[[LoadedModel], list[str]]
) -> LoadedModel:
    """`load()` on every process of a sharded run, one process at a time, rank 0 last: each other process lets go of
    the weights of the parts it will shard (`sharded(model)`: `without_weights`) before the next process reads, and
    rank 0 keeps them to send each process its shards (`shard_parts(from_rank0=True)`). The host RAM of all the
    processes together is then at most one process's load beside the others' kept parts (the frozen ones), where N
    processes reading at once held N whole models. Each turn ends at a `Distributed.barrier`: a process whose load
    fails ends the others' wait with its error."""
    model = None
    for turn in [*range(1, dist.world_size), 0]:
        if dist.rank == turn:
            model = load()
            if not dist.is_main:
                for name in sharded(model):
                    without_weights(model.part(name))
                give_back_freed_memory()
        dist.barrier()
    return model


def shard_parts(
    family: Family,
    model: LoadedModel,
    parts: list[str],
    settings: ShardSettings,
    dist: Distributed,
    from_rank0: bool = False,
) -> ShardedParts:
    """`fully_shard` each declared block of each part in `parts`, then the part; the sharded parts.

    `from_rank0`: rank 0 alone holds the parts' weights (`load_in_turns`; the other processes' parameters are on the
    meta device). Every process shards the part without its weights (rank 0 takes them out first, `without_weights`)
    and rank 0 sends each process its shards, a tensor at a time (torch's `set_model_state_dict` with
    `broadcast_from_rank0`), then lets go of the whole weights. Off, every process cuts its shards from its own."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    mesh = init_device_mesh(dist.device.type, (dist.world_size,))
    # FSDP2's CPU offload needs an accelerator to gather to; on a CPU the shards are in CPU memory anyway.
    offload = CPUOffloadPolicy() if settings.cpu_offload and dist.device.type != "cpu" else OffloadPolicy()
    skeletons, blocks = {}, {}
    for name in parts:
        module = model.part(name)
        whole, tied = None, _tied_groups(module)
        if from_rank0:
            whole = module.state_dict() if dist.is_main else {}  # rank 0's tensors, held here alone after
            without_weights(module)
        if dist.is_main:
            skeletons[name] = meta_skeleton(module)
        stored = {p.dtype for p in module.parameters() if p.is_floating_point()}
        narrower = settings.compute_dtype is not None and stored == {torch.float32}
        precision = MixedPrecisionPolicy(
            param_dtype=settings.compute_dtype if narrower else None, reduce_dtype=settings.reduce_dtype
        )
        count = 0
        for path in family.layer_blocks.get(name, ()):
            for block in module.get_submodule(path):
                fully_shard(block, mesh=mesh, mp_policy=precision, offload_policy=offload)
                count += 1
        fully_shard(module, mesh=mesh, mp_policy=precision, offload_policy=offload)
        if from_rank0:
            options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
            set_model_state_dict(module, whole, options=options)
            _tie_again(module, tied)  # assigned a tensor per name
            del whole
            give_back_freed_memory()
        blocks[name] = count
    return ShardedParts(model, parts, dist, blocks, skeletons)
