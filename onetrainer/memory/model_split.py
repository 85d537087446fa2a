"""Model split: a part's blocks spread over several devices of one process, activations handed from one to the next.

For a model whose LoRA no single device holds (`multi_gpu_mode` MODEL_SPLIT). The part's declared blocks
(`Family.layer_blocks`, ModuleLists in execution order) live on the devices in order, the first blocks on the first
device, the next ones on the next, each device's share of the blocks' bytes following its free memory
(`assign_blocks`). Everything of the part outside the blocks (the embedders before them, the output layers after them,
the part's own parameters) lives on the first device, the run's training device, where the other parts are too.

Nothing else of the model changes: a pre-hook on each block moves every tensor it is given (the hidden states, the
text states, the time embedding, the rotary embeddings, in whatever tuple, list or dict) to the block's device, and
its outputs stay there for the next block, so activations cross between devices only where consecutive blocks sit on
different ones. The part's other direct children get the same hook (an output layer is given the last block's hidden
states), and the part's outputs go back to the first device. Within one forward pass an input that several blocks of a
device are given (the text states, the rotary embeddings) is copied to that device once. Autograd follows the copies,
so the backward pass runs on each block's own device; gradient checkpointing recomputes a block through the same hook.

A LoRA's adapters are inside the blocks' layers and move with them; the optimizer steps each weight where it is.
Where the devices are of different kinds (a GPU and the CPU), a block on the other kind computes under the same
autocast as the first device's.

This module never reads the config (`training/placement.py` builds a split from it).
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Sequence

import torch


class SplitError(ValueError):
    """The part cannot be split as asked (no blocks at the paths, fewer than two devices, a bad budget)."""


def assign_blocks(sizes: Sequence[int], budgets: Sequence[float]) -> list[int]:
    """Each block's device (an index into `budgets`), in order and never decreasing: device d takes the blocks whose
    middle byte falls in its share of the blocks' bytes, its share being budgets[d] / sum(budgets) of them. A device
    whose budget is 0 takes none; a device whose share is smaller than half a block may take none too."""
    if not budgets:
        raise SplitError("a split needs at least one device")
    if any(b < 0 for b in budgets):
        raise SplitError(f"a device's memory budget cannot be negative: {list(budgets)}")
    if any(s < 0 for s in sizes):
        raise SplitError(f"a block's size cannot be negative: {list(sizes)}")
    total_budget = float(sum(budgets))
    if total_budget <= 0:
        raise SplitError(f"no device has memory for the blocks: budgets {list(budgets)}")
    total = float(sum(sizes))
    ends, running = [], 0.0  # each device's share ends at this many bytes into the blocks
    for budget in budgets:
        running += budget
        ends.append(total * running / total_budget)
    ends[-1] = float("inf")  # what rounding leaves over goes to the last device
    out, before, device = [], 0.0, 0
    for size in sizes:
        middle = before + size / 2
        while middle > ends[device]:
            device += 1
        out.append(device)
        before += size
    return out


def block_modules(module: torch.nn.Module, block_paths: Sequence[str]) -> list[torch.nn.Module]:
    """The blocks of `module` under `block_paths` (ModuleLists, in execution order; a path the module lacks is passed
    over, as a family names the paths of each of its variants)."""
    blocks: list[torch.nn.Module] = []
    for path in block_paths:
        try:
            found = module.get_submodule(path)
        except AttributeError:
            continue
        blocks.extend(found)
    if not blocks:
        where = " or ".join(f"'{p}'" for p in block_paths)
        raise SplitError(f"{type(module).__name__} has no blocks at {where} to split")
    return blocks


def module_bytes(module: torch.nn.Module) -> int:
    """The bytes of a module's parameters and buffers (a LoRA's adapters included)."""
    return sum(t.numel() * t.element_size() for t in (*module.parameters(), *module.buffers()))


def _moved(value, device: torch.device, cache: dict | None):
    """`value` with every tensor in it on `device` (tuples, lists, dicts and diffusers' / transformers' output classes
    rebuilt); `cache` (id → (original, copy)) hands one copy of the same tensor to every block of a device."""
    if isinstance(value, torch.Tensor):
        if value.device == device:
            return value
        if cache is None:
            return value.to(device)
        key = (id(value), device)
        hit = cache.get(key)
        # The original is kept, so its id is not reused while the entry lives; its version tells an in-place change.
        if hit is None or hit[0] is not value or hit[2] != value._version:
            hit = (value, value.to(device), value._version)
            cache[key] = hit
        return hit[1]
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a named tuple
        return type(value)(*(_moved(v, device, cache) for v in value))
    if isinstance(value, list | tuple):
        return type(value)(_moved(v, device, cache) for v in value)
    if isinstance(value, dict):
        moved = {k: _moved(v, device, cache) for k, v in value.items()}
        if type(value) is dict:
            return moved
        try:
            return type(value)(**moved)  # diffusers' BaseOutput, transformers' ModelOutput
        except TypeError:
            return moved
    return value


class ModelSplit:
    """`module`'s blocks under `block_paths` on `devices` as `assignment` gives them (block → index into `devices`,
    `assign_blocks`), the rest of the module on the first device. Inactive until `attach()`; `detach(device)` puts the
    whole module on one device again (the hooks stay and do nothing while detached); `remove()` takes the hooks off."""

    def __init__(
        self,
        module: torch.nn.Module,
        block_paths: Sequence[str],
        devices: Sequence[torch.device | str],
        assignment: Sequence[int],
    ) -> None:
        self.module = module
        self.blocks = block_modules(module, block_paths)
        self.devices = [torch.device(d) for d in devices]
        if len(self.devices) < 2:
            raise SplitError(f"a split needs two devices or more, not {len(self.devices)}")
        if len(assignment) != len(self.blocks):
            raise SplitError(f"{len(assignment)} devices assigned to {len(self.blocks)} blocks")
        if any(not 0 <= d < len(self.devices) for d in assignment):
            raise SplitError(f"a block assigned to a device out of range: {list(assignment)}")
        if any(b < a for a, b in itertools.pairwise(assignment)):
            raise SplitError(f"the blocks must go to the devices in order: {list(assignment)}")
        self.assignment = list(assignment)
        self.first = self.devices[0]
        self.active = False
        self._cache: dict | None = None  # the copies of this forward pass's inputs, while the module's forward runs
        self._autocasts: list[contextlib.AbstractContextManager] = []
        self._hooks = []
        block_ids = {id(b) for b in self.blocks}
        containers = {id(module.get_submodule(p)) for p in block_paths if _has(module, p)}
        for index, block in enumerate(self.blocks):
            self._hook(block, lambda i=index: self.devices[self.assignment[i]])
        # Every other child (along the paths to the block lists too) is given its inputs on the first device.
        for parent in _parents(module, block_paths):
            for child in parent.children():
                if id(child) in block_ids or id(child) in containers or _is_parent(child, module, block_paths):
                    continue
                for callee in _called(child):
                    self._hook(callee, lambda: self.first)
        self._hooks.append(module.register_forward_pre_hook(self._module_pre, with_kwargs=True))
        self._hooks.append(module.register_forward_hook(self._module_post, always_call=True))

    def _hook(self, target: torch.nn.Module, device_of) -> None:
        def pre(_module, args, kwargs):
            if not self.active:
                return None
            device = device_of()
            if device.type != self.first.type and torch.is_autocast_enabled(self.first.type):
                dtype = torch.get_autocast_dtype(self.first.type)
                context = torch.autocast(device.type, dtype=dtype)
                context.__enter__()
                self._autocasts.append(context)
            else:
                self._autocasts.append(contextlib.nullcontext())
            return _moved(args, device, self._cache), _moved(kwargs, device, self._cache)

        def post(_module, _args, _output):
            if self.active and self._autocasts:
                self._autocasts.pop().__exit__(None, None, None)

        self._hooks.append(target.register_forward_pre_hook(pre, with_kwargs=True))
        self._hooks.append(target.register_forward_hook(post, always_call=True))

    def _module_pre(self, _module, args, kwargs):
        if not self.active:
            return None
        self._cache = {}
        return _moved(args, self.first, None), _moved(kwargs, self.first, None)

    def _module_post(self, _module, _args, output):
        if not self.active:
            return None
        self._cache = None
        return _moved(output, self.first, None)

    # -- placing the module -------------------------------------------------------------------------------------------

    def attach(self) -> None:
        """The blocks on their devices, the rest of the module on the first device."""
        index = {id(b): i for i, b in enumerate(self.blocks)}
        held = {id(b) for b in self.blocks}
        self._rest_to(self.module, self.first, held)
        for block in self.blocks:
            block.to(self.devices[self.assignment[index[id(block)]]])
        self.active = True

    def _rest_to(self, module: torch.nn.Module, device: torch.device, held: set[int]) -> None:
        """`module` on `device`, except the blocks in `held` (left where they are): a child without blocks inside
        moves with `Module.to`, as a whole part moves (quantized layers carry their state along), the module's own
        tensors and those of the blocks' parents one by one."""
        for name, param in module.named_parameters(recurse=False):
            if param.device != device:
                module._parameters[name] = _param_to(param, device)
        for name, buffer in module.named_buffers(recurse=False):
            if buffer is not None and buffer.device != device:
                module._buffers[name] = buffer.to(device)
        for child in module.children():
            if id(child) in held:
                continue
            if any(id(inner) in held for inner in child.modules()):
                self._rest_to(child, device, held)
            else:
                child.to(device)

    def detach(self, device: torch.device | str) -> None:
        """The whole module on `device`; the hooks go quiet."""
        self.active = False
        self._cache = None
        self.module.to(device)

    def remove(self) -> None:
        self.detach(self.first)
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()

    # -- facts --------------------------------------------------------------------------------------------------------

    def block_device(self, index: int) -> torch.device:
        return self.devices[self.assignment[index]]

    def bytes_per_device(self) -> list[int]:
        """The blocks' bytes on each device (in `devices`' order)."""
        out = [0] * len(self.devices)
        for block, device in zip(self.blocks, self.assignment):
            out[device] += module_bytes(block)
        return out

    def describe(self) -> str:
        """ "blocks 0–17 on cuda:0 (3.1 GB), 18–37 on cuda:1 (3.4 GB)" for the run's status line."""
        sizes = self.bytes_per_device()
        words = []
        for d, device in enumerate(self.devices):
            indexes = [i for i, a in enumerate(self.assignment) if a == d]
            if not indexes:
                words.append(f"none on {device}")
                continue
            span = f"block {indexes[0]}" if len(indexes) == 1 else f"blocks {indexes[0]}–{indexes[-1]}"
            words.append(f"{span} on {device} ({sizes[d] / 2**30:.2f} GiB)")
        return ", ".join(words)


def _param_to(param: torch.nn.Parameter, device: torch.device) -> torch.nn.Parameter:
    param.data = param.data.to(device)  # the same Parameter object: the optimizer and the adapters keep holding it
    return param


def _called(module: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules a forward pass calls for `module`: itself, or for a ModuleList / ModuleDict (never called), its
    entries (Z-Image's final layers are a ModuleDict by patch size)."""
    if isinstance(module, torch.nn.ModuleList | torch.nn.ModuleDict):
        return [m for child in module.children() for m in _called(child)]
    return [module]


def _has(module: torch.nn.Module, path: str) -> bool:
    try:
        module.get_submodule(path)
    except AttributeError:
        return False
    return True


def _parents(module: torch.nn.Module, block_paths: Sequence[str]) -> list[torch.nn.Module]:
    """The module and every module on the way down to a block list (the lists' parents)."""
    out = [module]
    for path in block_paths:
        if not _has(module, path):
            continue
        parts = path.split(".")
        for n in range(1, len(parts)):
            parent = module.get_submodule(".".join(parts[:n]))
            if all(parent is not o for o in out):
                out.append(parent)
    return out


def _is_parent(child: torch.nn.Module, module: torch.nn.Module, block_paths: Sequence[str]) -> bool:
    return any(child is p for p in _parents(module, block_paths)[1:])
