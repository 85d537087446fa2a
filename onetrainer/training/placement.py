"""Which model parts sit on the training device, and when they move.

A family declares each part's role (`Family.part_roles`) and the parts its samples need (`Family.sampling_parts`).
During training the device holds what a step runs: the trained parts, the denoiser, and the encoders whose outputs
are not cached. Parts only used for samples (a decoder, a VQGAN, its own text encoder) stay off the device until a
sample is rendered and go back afterwards; frozen encoders go off the device once their outputs are cached.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator

import torch

from onetrainer.families.base import PartRole
from onetrainer.memory.layer_offload import LayerOffload
from onetrainer.memory.model_split import ModelSplit

DEVICE, OFFLOAD = "device", "offload"


class Placement:
    """Moves the parts of a model between the training device and the offload device (the CPU), and remembers where
    each is (`location`) and every move made (`moves`: (part, where) in order)."""

    def __init__(
        self,
        parts: dict[str, torch.nn.Module],
        roles: dict[str, PartRole],
        sampling_parts: Iterable[str],
        device: torch.device | str,
        offload: torch.device | str = "cpu",
    ) -> None:
        self.parts, self.roles = parts, roles
        self.sampling_parts = set(sampling_parts)
        self.device, self.offload = torch.device(device), torch.device(offload)
        self.location: dict[str, str] = {}
        self.moves: list[tuple[str, str]] = []
        # Parts whose blocks are offloaded (`memory/layer_offload.py`): placed by their offloader, never whole.
        self.offloads: dict[str, LayerOffload] = {}
        # Parts whose blocks are spread over several devices (`memory/model_split.py`): placed by their split.
        self.splits: dict[str, ModelSplit] = {}
        # Parts sharded over the processes (`training/sharding.py`): each rank's shard is on the device for good.
        self.sharded: set[str] = set()

    def per_step(self, trained: Iterable[str], latents_cached: bool, text_cached: bool) -> set[str]:
        """The parts a training step runs."""
        needed = set(trained)
        skipped = {PartRole.SAMPLING}
        if text_cached:
            skipped.add(PartRole.TEXT_ENCODER)
        if latents_cached:
            skipped.add(PartRole.IMAGE_ENCODER)
        needed |= {name for name, role in self.roles.items() if role not in skipped}
        return needed & set(self.parts)

    def place(self, on_device: Iterable[str]) -> None:
        """Put exactly `on_device` on the training device, every other part on the offload device."""
        wanted = set(on_device) | self.sharded
        for name, module in self.parts.items():
            where = DEVICE if name in wanted else OFFLOAD
            if self.location.get(name) != where:
                offload = self.offloads.get(name)
                split = self.splits.get(name)
                if split is not None:
                    if where == DEVICE:
                        split.attach()
                    else:
                        split.detach(self.offload)
                elif offload is None:
                    module.to(self.device if where == DEVICE else self.offload)
                elif where == DEVICE:
                    offload.attach(self.device)
                else:
                    offload.detach(self.offload)
                self.location[name] = where
                self.moves.append((name, where))

    def wait_on_host(self, names: Iterable[str]) -> None:
        """`names`, in host RAM as loaded, stay there, unmoved, until they are sharded (`mark_sharded`): a process
        other than rank 0 holds them without their weights until rank 0 sends it its shards (`sharding.load_in_turns`),
        and a module without weights cannot be moved."""
        for name in names:
            self.location[name] = OFFLOAD

    def mark_sharded(self, names: Iterable[str]) -> None:
        """`names` were sharded (FSDP2 moved each block's shard to the device as it sharded it): on the device from
        now on, and never moved whole."""
        for name in names:
            self.sharded.add(name)
            self.location[name] = DEVICE

    def offload_layers(self, name: str, offload: LayerOffload) -> None:
        """From now on, `name` goes to the device through `offload` (its blocks a window at a time)."""
        if self.location.get(name) == DEVICE:
            self.parts[name].to(self.offload)
            self.location[name] = OFFLOAD
        self.offloads[name] = offload

    def split_part(self, name: str, split: ModelSplit) -> None:
        """From now on, `name` goes to the device through `split` (its blocks on several devices)."""
        self.splits[name] = split
        if self.location.get(name) == DEVICE:
            split.attach()

    @contextlib.contextmanager
    def whole(self, written: bool = False) -> Iterator[None]:
        """Every offloaded weight readable in its module for the duration (saving a model or a backup reads them;
        with `written`, restoring a backup writes them)."""
        with contextlib.ExitStack() as stack:
            for offload in self.offloads.values():
                stack.enter_context(offload.in_place(written))
            yield

    def on_device(self) -> set[str]:
        return {name for name, where in self.location.items() if where == DEVICE}

    @contextlib.contextmanager
    def using(self, names: Iterable[str]) -> Iterator[None]:
        """`names` on the device as well for the duration (sampling, validation); then back where they were."""
        before = self.on_device()
        self.place(before | set(names))
        try:
            yield
        finally:
            self.place(before)

    def for_sampling(self) -> contextlib.AbstractContextManager[None]:
        return self.using(self.sampling_parts)

    def for_encoding(self) -> contextlib.AbstractContextManager[None]:
        """The encoders on the device (validation encodes its images and captions)."""
        encoders = {n for n, r in self.roles.items() if r in (PartRole.TEXT_ENCODER, PartRole.IMAGE_ENCODER)}
        return self.using(encoders)


def offloaded_parts(config, family) -> dict[str, Callable[[torch.nn.Module], LayerOffload]]:
    """The parts whose `offload_fraction` asks for layer offloading (where the family declares it for the part), each
    with how to make its offloader once the module is final (after the method's adapters)."""
    from functools import partial

    from onetrainer.config.enums import TrainingMethod
    from onetrainer.config.model_types import LAYER_OFFLOADING, left_out

    out = {}
    for part in family.info.parts:
        fraction = config.part(part).offload_fraction
        if left_out(config, part):
            continue
        if fraction > 0 and LAYER_OFFLOADING in family.info.part_capabilities.get(part, ()):
            blocks = family.layer_blocks[part]
            # A fine-tune's trained layers move too where the fused back pass updates them inside the window.
            trained = (
                config.training_method is TrainingMethod.FINE_TUNE
                and bool(config.optimizer.fused_back_pass)
                and bool(config.part(part).train)
            )
            out[part] = partial(
                LayerOffload,
                block_paths=blocks,
                fraction=fraction,
                async_copies=config.async_offloading,
                trained=trained,
            )
    return out


def free_memory(device: torch.device) -> int:
    """The bytes free on `device` now: CUDA's free memory, else the RAM available."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    import psutil

    return psutil.virtual_memory().available


def split_denoiser(family, model, devices: list[torch.device], free=free_memory) -> ModelSplit:
    """The denoiser's declared blocks (`Family.layer_blocks`) spread over `devices` (`multi_gpu_mode` MODEL_SPLIT),
    each device's share of their bytes following its free memory (`free`, measured now, the denoiser still in CPU
    memory); the first device's budget less what of the denoiser lives there besides its blocks. Not attached yet."""
    from onetrainer.memory.model_split import SplitError, assign_blocks, block_modules, module_bytes

    part = family.denoiser_part
    paths = family.layer_blocks.get(part)
    if not paths:
        raise SplitError(
            f"{type(family).__name__} declares no blocks of its {part} to split: train it on one device "
            "(multi_gpu_mode DATA_PARALLEL)"
        )
    module = model.part(part)
    blocks = block_modules(module, paths)
    sizes = [module_bytes(b) for b in blocks]
    rest = module_bytes(module) - sum(sizes)
    budgets = [free(d) for d in devices]
    budgets[0] = max(0, budgets[0] - rest)
    return ModelSplit(module, paths, devices, assign_blocks(sizes, budgets))
