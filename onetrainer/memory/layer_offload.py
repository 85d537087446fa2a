"""Layer offloading: a part's blocks (a transformer's layers) kept in CPU memory and moved to the device as they run.

`offload_fraction` of the blocks are off the device at any time: the device holds a window of the others, which slides
with the execution, front to back in a forward pass and back to front in the backward pass (as OneTrainer's layer
offloading, docs/RamOffloading.md there). After a block has run, its weights leave the device and the next block
beyond the window is copied in, ahead of its use. At the end of a forward pass the last blocks are on the device, as
the backward pass wants them; at the end of the backward pass the first ones, as the next forward pass wants them.

Frozen weights move host to device only: the CPU copy stays valid, so leaving the device is dropping the device copy.
With `trained` (a fine-tune with the fused back pass, `training/fused_back_pass.py`) the trained weights inside the
blocks move too: a block the backward pass has been through was updated on the device, so when it leaves, its weights
are copied back to the CPU and so are its gradients (held between micro-batches of an accumulated step) and the
optimizer's state for them; the state comes to the device only for the backward pass, where the update happens.
Otherwise trainable weights (a LoRA's adapters, which live inside the blocks) stay on the device.

A block's moving weights live in one CPU buffer, each weight a view into it, and move as one copy: one transfer per
block, not one per tensor. On CUDA that buffer is page-locked in place (`cudaHostRegister`) at its exact size: torch's
pinned-memory allocator rounds every allocation up to a power of two, which for a transformer's weight shapes costs
about half as much RAM again. A block off the device holds an empty tensor in place of each moved weight, so a use
out of turn fails loudly rather than computing with stale data.

How the backward pass is followed: a hook on each block's outputs fires when the gradient reaching them is complete,
which is just before the block's own backward nodes run. Gradient checkpointing recomputes a block's forward inside the
backward pass; those forwards are told apart (`_in_backward`) and leave the window where it is. Autograd's saved
references to a weight see the tensor the parameter holds at the time they are used, which is the device copy again
by then.

On CUDA with `async_copies`, copies run on a side stream (non-blocking from page-locked memory) and the compute stream
waits for a block's copy only when it runs it. On a CPU a "copy" is a clone, and the same code runs, which is how the
tests check the order of the moves and that results do not change.
"""

from __future__ import annotations

import contextlib
import weakref
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch

MOVES_KEPT = 1024
ALIGNMENT = 256  # bytes between weights in a block's buffer: any dtype's view, and the copy engines' preferred start


class OffloadError(ValueError):
    """The part cannot be offloaded as configured (no blocks at that path, a fraction out of range)."""


def _in_backward() -> bool:
    """Whether autograd's engine is running a backward pass on this thread (a checkpoint's recomputed forward)."""
    return torch._C._current_graph_task_id() != -1


def _tensors(value) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _tensors(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)
    elif hasattr(value, "to_tuple"):  # diffusers' and transformers' output classes
        yield from _tensors(value.to_tuple())


@dataclass
class _Block:
    module: torch.nn.Module
    # (parameter, its CPU copy: a view into `home`) for every frozen weight that moves
    weights: list[tuple[torch.nn.Parameter, torch.Tensor]] = field(default_factory=list)
    home: torch.Tensor | None = None  # the weights' CPU buffer (bytes)
    offsets: list[int] = field(default_factory=list)  # each weight's byte offset in `home`
    params: int = 0  # the moving weights' elements
    loaded: bool = True
    ready: torch.cuda.Event | None = None  # the copy's completion on the side stream, until the block first runs
    trained: list[torch.nn.Parameter] = field(default_factory=list)  # of the moving weights, those trained
    dirty: bool = False  # the backward pass went through it since it came: its trained weights may have changed
    # The trained weights' gradients and optimizer state are on the device (they come for the backward pass only);
    # off it, the gradients wait in `grads` and the optimizer's state holds CPU tensors.
    extras_loaded: bool = False
    grads: dict[int, torch.Tensor] = field(default_factory=dict)  # id(param) -> its gradient, while off the device
    homes: dict[tuple[int, str], torch.Tensor] = field(default_factory=dict)  # reused CPU tensors for the extras


def _travels(value) -> bool:
    """An optimizer state entry that moves with its weight: a tensor of more than one element (the moments, factored
    statistics, momentum buffers). Step counters stay where the optimizer keeps them."""
    return isinstance(value, torch.Tensor) and value.numel() > 1


def _aligned(size: int) -> int:
    return -(-size // ALIGNMENT) * ALIGNMENT


def _view(buffer: torch.Tensor, offset: int, like: torch.Tensor) -> torch.Tensor:
    """The bytes of `buffer` at `offset` as a tensor of `like`'s dtype and shape."""
    size = like.numel() * like.element_size()
    return buffer[offset : offset + size].view(like.dtype).view(like.shape)


def _page_locked(buffer: torch.Tensor) -> bool:
    """Page-lock `buffer` where it is (CUDA's host registration) so copies from it can run asynchronously."""
    cudart = torch.cuda.cudart()
    return cudart.cudaHostRegister(buffer.data_ptr(), buffer.numel(), 0) == cudart.cudaError.success


def _unlock(pointers: list[int]) -> None:
    for pointer in pointers:
        torch.cuda.cudart().cudaHostUnregister(pointer)


class LayerOffload:
    """Offloads `fraction` of the blocks of `module` found under `block_paths` (ModuleLists, in execution order).
    A path the module lacks is passed over (a family names the paths of each of its variants' modules, where they
    differ); none found is an error.

    Inactive until `attach(device)`; `detach(offload_device)` puts every weight back in the module, as an ordinary
    module on that device. The hooks stay on the blocks and do nothing while detached."""

    def __init__(
        self,
        module: torch.nn.Module,
        block_paths: Sequence[str],
        fraction: float,
        async_copies: bool = True,
        trained: bool = False,
    ) -> None:
        if not 0.0 < fraction <= 1.0:
            raise OffloadError(f"an offload fraction must lie in (0, 1], not {fraction}")
        blocks: list[torch.nn.Module] = []
        found_any = False
        for path in block_paths:
            try:
                found = module.get_submodule(path)
            except AttributeError:
                continue
            found_any = True
            blocks.extend(found)
        if not found_any:
            where = " or ".join(f"'{p}'" for p in block_paths)
            raise OffloadError(f"{type(module).__name__} has no blocks at {where}")
        if len(blocks) < 2:
            raise OffloadError(f"{type(module).__name__} has {len(blocks)} block(s) under {list(block_paths)}")
        self.module = module
        self.blocks = [_Block(b) for b in blocks]
        self.offloaded = min(len(blocks) - 1, round(fraction * len(blocks)))
        self.window = len(blocks) - self.offloaded  # blocks on the device at a time
        self.async_copies = async_copies
        self.trained = trained  # trained weights move too (needs the fused back pass to update them in the window)
        self.optimizer: torch.optim.Optimizer | None = None  # whose state for the trained weights moves with them
        self.device: torch.device | None = None
        self._copy_stream: torch.cuda.Stream | None = None
        self._backward_at: int | None = None  # the block the running backward pass has reached
        # (block, "in" | "out"), the latest moves for the tests: bounded, as a run makes two per block and pass
        self.moves: deque[tuple[int, str]] = deque(maxlen=MOVES_KEPT)
        self.peak_resident = 0  # the most blocks on the device at once
        self.peak_resident_params = 0  # the most moving weights' elements on the device at once
        self._resident = self._resident_params = 0  # on the device now (kept as blocks move, not recounted)
        self._locked: list[int] = []  # page-locked buffers' addresses, unlocked when this offloader goes
        weakref.finalize(self, _unlock, self._locked)
        self._hooks = []
        for index, block in enumerate(self.blocks):
            self._hooks.append(block.module.register_forward_pre_hook(self._pre_hook(index)))
            self._hooks.append(block.module.register_forward_hook(self._post_hook(index)))

    # -- placing the part ---------------------------------------------------------------------------------------------

    @property
    def active(self) -> bool:
        return self.device is not None

    def attach(self, device: torch.device | str) -> None:
        """Put the part on `device` with the first `window` blocks there and the others' frozen weights in CPU memory
        (page-locked when the device is a GPU): the peak never holds the whole part."""
        device = torch.device(device)
        if self.active:
            self.detach(torch.device("cpu"))
        for block in self.blocks:
            # Trained weights stay unless `trained`, and so do weights of a tensor subclass (bitsandbytes' NFLOAT_4
            # keeps its quantization state beside the data, which a swap of the data would leave behind).
            moving = [
                p
                for p in block.module.parameters()
                if (self.trained or not p.requires_grad) and type(p) is torch.nn.Parameter
            ]
            self._make_home(block, moving, pin=device.type == "cuda")
            block.trained = [p for p in moving if p.requires_grad]
            block.dirty = False
            block.extras_loaded = False
            block.loaded = False
        self.module.to(device)  # what stays: everything outside the blocks, the trained weights, the empty stand-ins
        self.device = device
        if device.type == "cuda" and self.async_copies:
            self._copy_stream = torch.cuda.Stream(device)
        self._resident = self._resident_params = 0
        for index in range(self.window):
            self._load(index, ahead=False)

    def _make_home(self, block: _Block, moving: list[torch.nn.Parameter], pin: bool) -> None:
        """One CPU buffer for the block's moving weights, each weight a view into it (and an empty stand-in in the
        module until the block is loaded)."""
        offsets, size = [], 0
        for param in moving:
            offsets.append(size)
            size += _aligned(param.numel() * param.element_size())
        home = torch.empty(size, dtype=torch.uint8)
        if pin and size:
            if _page_locked(home):
                self._locked.append(home.data_ptr())
            else:  # registration refused (a locked-memory limit): torch's pinned allocator, rounded up
                home = home.pin_memory()
        block.home, block.offsets, block.weights = home, offsets, []
        block.params = sum(param.numel() for param in moving)
        for param, offset in zip(moving, offsets):
            view = _view(home, offset, param.data)
            view.copy_(param.data)
            block.weights.append((param, view))
            param.data = self._empty(param, torch.device("cpu"))

    def detach(self, offload_device: torch.device | str) -> None:
        """Every weight back in the module, the whole part on `offload_device`; the hooks go quiet."""
        for block in self.blocks:
            if block.loaded:
                self._flush(block)
                self._extras_out(block)
        self._wait_for_copies()
        # Unlocked while still allocated: a buffer must not be freed while registered with the driver.
        _unlock(self._locked)
        self._locked.clear()
        offload_device = torch.device(offload_device)
        for block in self.blocks:
            for param, home in block.weights:
                param.data = home.clone()  # a tensor of its own: the module is ordinary again, the buffer goes
            for param in block.trained:
                grad = block.grads.pop(id(param), None)
                if grad is not None:
                    param.grad = grad.to(offload_device)
                for key, value in self._state(param).items():
                    if _travels(value):
                        self._state(param)[key] = value.to(offload_device)
            block.weights, block.home, block.offsets, block.trained, block.homes = [], None, [], [], {}
            block.loaded = True
            block.ready = None
            block.dirty = block.extras_loaded = False
        self.device = None
        self._copy_stream = None
        self._backward_at = None
        self.module.to(offload_device)

    @contextlib.contextmanager
    def in_place(self, written: bool = False) -> Iterator[None]:
        """Every moving weight as its CPU copy in the module for the duration, for whoever reads the whole state
        (saving, a backup) or, with `written`, writes it (restoring a backup: the blocks on the device are copied again
        from what was written); then as it was."""
        if not self.active:
            yield
            return
        for block in self.blocks:
            if block.loaded:
                self._flush(block)  # the CPU copy of trained weights is the one read
        self._wait_for_copies()
        before = [(param, param.data) for block in self.blocks for param, _ in block.weights]
        for block in self.blocks:
            for param, home in block.weights:
                param.data = home
        try:
            yield
        finally:
            if not written:
                for param, data in before:
                    param.data = data
            else:
                for block in self.blocks:
                    block.ready = None
                    # A restored optimizer state lies in CPU memory (it follows the weights' device when loaded): it
                    # comes to the device with the next backward pass, as an offloaded block's state does.
                    block.grads.clear()
                    block.dirty = block.extras_loaded = False
                    if block.loaded:
                        self._fill(block, ahead=False)
                    else:
                        for param, _ in block.weights:
                            param.data = self._empty(param, self.device)

    def remove(self) -> None:
        """Take the hooks off the blocks (after `detach`)."""
        for hook in self._hooks:
            hook.remove()
        self._hooks = []

    # -- the hooks ----------------------------------------------------------------------------------------------------

    def _pre_hook(self, index: int):
        def hook(_module, _args):
            if not self.active:
                return
            if _in_backward():  # a checkpoint recomputing this block: the backward pass put it here already
                self._use(index, backward=True)
                return
            self._backward_at = None
            self._use(index)
            self._slide(index, forward=True)

        return hook

    def _post_hook(self, index: int):
        def hook(_module, _args, output):
            if not self.active or _in_backward() or not torch.is_grad_enabled():
                return
            for tensor in _tensors(output):
                if tensor.requires_grad:
                    tensor.register_hook(lambda _grad: self._backward_reached(index))

        return hook

    def _backward_reached(self, index: int) -> None:
        if self._backward_at is not None and self._backward_at <= index:
            return  # another output of the same block (or of a later one arriving late): the window is there
        self._backward_at = index
        self._use(index, backward=True)
        self._slide(index, forward=False)

    # -- moving blocks ------------------------------------------------------------------------------------------------

    def _slide(self, index: int, forward: bool) -> None:
        """The window starting at `index` in the direction of execution: blocks outside it leave, blocks inside it that
        are not on the device yet are copied in (ahead of use, when copies are asynchronous)."""
        count = len(self.blocks)
        # `window` blocks from `index` on; near the end, the last ones run stay (the other pass starts with them)
        if forward:
            first = min(index, count - self.window)
            wanted = range(first, first + self.window)
        else:
            last = max(index, self.window - 1)
            wanted = range(last, last - self.window, -1)
        inside = set(wanted)
        for other, block in enumerate(self.blocks):
            if block.loaded and other not in inside:
                self._unload(other)
        for other in wanted:
            block = self.blocks[other]
            if not block.loaded:
                self._load(other, ahead=True, extras=not forward)
            elif not forward and block.trained and not block.extras_loaded:
                self._fill_extras(block, ahead=True)

    def _load(self, index: int, ahead: bool, extras: bool = False) -> None:
        block = self.blocks[index]
        self._fill(block, ahead)
        if extras and block.trained:
            self._fill_extras(block, ahead)
        block.loaded = True
        self.moves.append((index, "in"))
        self._resident += 1
        self._resident_params += block.params
        self.peak_resident = max(self.peak_resident, self._resident)
        self.peak_resident_params = max(self.peak_resident_params, self._resident_params)

    def _fill(self, block: _Block, ahead: bool) -> None:
        """The block's buffer copied to the device in one transfer, each weight a view into the copy; `ahead`: on the
        side stream (when copies are asynchronous), the block's `ready` event marking its end."""
        assert self.device is not None
        if block.home is None or not block.weights:
            return
        stream = self._copy_stream if ahead else None
        copy = self._to_device(block.home, stream)
        for (param, home), offset in zip(block.weights, block.offsets):
            param.data = _view(copy, offset, home)
        self._mark_ready(block, stream)

    def _fill_extras(self, block: _Block, ahead: bool) -> None:
        """The trained weights' gradients and optimizer state back on the device, for the backward pass that updates
        them (on the side stream when `ahead`, the block's `ready` event then marking the end of both copies)."""
        stream = self._copy_stream if ahead else None
        for param in block.trained:
            grad = block.grads.pop(id(param), None)
            if grad is not None:
                param.grad = self._to_device(grad, stream)
            state = self._state(param)
            for key, value in state.items():
                if _travels(value):
                    state[key] = self._to_device(value, stream)
        self._mark_ready(block, stream)
        block.extras_loaded = True

    def _to_device(self, tensor: torch.Tensor, stream: torch.cuda.Stream | None) -> torch.Tensor:
        """`tensor` copied to the device: in line without a `stream`, else on it, non-blocking."""
        if stream is None:
            return self._copy(tensor)
        # Allocated in the compute stream's order, written on the side stream once the compute stream has reached this
        # point: memory a finished block gave back is reused at once. A copy allocated on the side stream could only
        # reuse memory after the compute stream caught up with the host, which runs far ahead of it, and CUDA's cache
        # grew to nearly the whole part (docs/benchmarks.md, layer offloading on an H200).
        compute = torch.cuda.current_stream(self.device)
        copy = torch.empty_like(tensor, device=self.device)
        stream.wait_stream(compute)
        with torch.cuda.stream(stream):
            copy.copy_(tensor, non_blocking=True)
        return copy

    @staticmethod
    def _mark_ready(block: _Block, stream: torch.cuda.Stream | None) -> None:
        """The block's `ready` event after the copies queued on `stream` so far (none in line)."""
        if stream is not None:
            block.ready = torch.cuda.Event()
            block.ready.record(stream)

    def _flush(self, block: _Block) -> None:
        """A block the backward pass went through: its trained weights copied back to their CPU home (on the compute
        stream, after the updates; `_wait_for_copies` waits for them before the CPU copy is read)."""
        if not block.dirty:
            return
        homes = dict((id(param), home) for param, home in block.weights)
        for param in block.trained:
            homes[id(param)].copy_(param.data, non_blocking=True)
        block.dirty = False

    def _extras_out(self, block: _Block) -> None:
        """The trained weights' gradients and optimizer state to CPU memory (page-locked tensors, reused each time)."""
        for param in block.trained:
            if param.grad is not None:
                block.grads[id(param)] = self._home_of(block, param, " grad", param.grad)
                param.grad = None
            state = self._state(param)
            for key, value in state.items():
                if _travels(value) and value is not block.homes.get((id(param), key)):
                    state[key] = self._home_of(block, param, key, value)
        block.extras_loaded = False

    def _home_of(self, block: _Block, param: torch.nn.Parameter, key: str, value: torch.Tensor) -> torch.Tensor:
        home = block.homes.get((id(param), key))
        if home is None or home.shape != value.shape or home.dtype != value.dtype:
            home = torch.empty(value.shape, dtype=value.dtype, pin_memory=self.device.type == "cuda")
            block.homes[(id(param), key)] = home
        home.copy_(value, non_blocking=True)
        return home

    def _state(self, param: torch.nn.Parameter) -> dict:
        if self.optimizer is None:
            return {}
        return self.optimizer.state.get(param, {})

    def carry_optimizer_state(self, optimizer: torch.optim.Optimizer) -> None:
        """From now on the state `optimizer` keeps for the trained weights moves with their blocks (`trained`)."""
        self.optimizer = optimizer
        for block in self.blocks:
            if not block.loaded and block.trained:
                self._extras_out(block)

    def _use(self, index: int, backward: bool = False) -> None:
        """Block `index` is about to run: on the device, its copy complete as seen from the compute stream (in the
        backward pass with its trained weights' gradients and optimizer state, and marked as updated)."""
        block = self.blocks[index]
        if not block.loaded:
            self._load(index, ahead=False, extras=backward)
        if backward and block.trained:
            if not block.extras_loaded:
                self._fill_extras(block, ahead=False)
            block.dirty = True
        if block.ready is not None:
            compute = torch.cuda.current_stream(self.device)
            compute.wait_event(block.ready)
            block.ready = None

    def _unload(self, index: int) -> None:
        block = self.blocks[index]
        if block.ready is not None:  # copied in but never run: the memory is reused once its copy is done
            torch.cuda.current_stream(self.device).wait_event(block.ready)
            block.ready = None
        if block.trained:
            self._flush(block)
            if block.extras_loaded or any(p.grad is not None for p in block.trained):  # (updated: extras loaded)
                self._extras_out(block)
        for param, _ in block.weights:
            param.data = self._empty(param, self.device)
        block.loaded = False
        self.moves.append((index, "out"))
        self._resident -= 1
        self._resident_params -= block.params

    def _copy(self, home: torch.Tensor) -> torch.Tensor:
        if self.device.type == "cpu":
            return home.clone()  # a distinct tensor, as a device copy is: nothing writes through to the CPU copy
        return home.to(self.device)

    def _wait_for_copies(self) -> None:
        for block in self.blocks:
            if block.ready is not None:
                block.ready.synchronize()
        if self.trained and self.device is not None and self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()  # trained weights copied back on the compute stream

    @staticmethod
    def _empty(param: torch.nn.Parameter, device: torch.device) -> torch.Tensor:
        return torch.empty(0, dtype=param.dtype, device=device)

    # -- facts --------------------------------------------------------------------------------------------------------

    def resident(self) -> list[int]:
        """The blocks whose weights are on the device now."""
        return [i for i, block in enumerate(self.blocks) if block.loaded]

    def host_bytes(self) -> int:
        """The CPU memory the moving weights take (their buffers, alignment included)."""
        return sum(block.home.numel() for block in self.blocks if block.home is not None)

    def page_locked_buffers(self) -> int:
        """How many block buffers are page-locked in place (on CUDA; the others went through torch's allocator)."""
        return len(self._locked)
