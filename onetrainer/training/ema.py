"""An exponential moving average of the trained weights (EMA), kept on the GPU or the CPU.

decay_t = min((1 + t) / (10 + t), decay) with t the number of updates so far: the average follows the weights
quickly at first and settles to the configured decay (a warm-up of the decay).

Over sharded weights (FSDP2's DTensors, `multi_gpu_mode` SHARDED) each process averages its own shard of every weight:
the average is sharded as the weights are. Its backup is then in the run's DCP shards (`shard_state`, which DCP reads
on any number of processes), and its `state_dict` holds the count of updates alone.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from onetrainer.training.sharding import local_shard


class EMA:
    def __init__(self, params: list[torch.nn.Parameter], decay: float, every: int, device: torch.device) -> None:
        self.params = params
        self.decay = decay
        self.every = max(1, every)
        self.device = device
        self.updates = 0
        self.sharded = any(hasattr(p, "to_local") for p in params)
        self.shadow = [local_shard(p).detach().to(device, torch.float32, copy=True) for p in params]

    def current_decay(self) -> float:
        return min((1 + self.updates) / (10 + self.updates), self.decay)

    @torch.no_grad()
    def after_step(self, global_step: int) -> bool:
        """Update the average every `every` optimizer steps; returns whether it did."""
        if global_step % self.every:
            return False
        decay = self.current_decay()
        for shadow, param in zip(self.shadow, self.params):
            shadow.mul_(decay).add_(local_shard(param).detach().to(shadow.device, torch.float32), alpha=1.0 - decay)
        self.updates += 1
        return True

    @contextlib.contextmanager
    def swapped_in(self) -> Iterator[None]:
        """Use the averaged weights inside the block (sampling, saving), the trained ones after it."""
        saved = [local_shard(p).detach().clone() for p in self.params]
        self.copy_to_params()
        try:
            yield
        finally:
            with torch.no_grad():
                for param, value in zip(self.params, saved):
                    local_shard(param).copy_(value)

    @torch.no_grad()
    def copy_to_params(self) -> None:
        for shadow, param in zip(self.shadow, self.params):
            local = local_shard(param)
            local.copy_(shadow.to(local.device, local.dtype))

    def state_dict(self) -> dict:
        """For a backup's `optimizer.pt`: the count of updates, and the averaged weights unless they are sharded (then
        they are in the backup's shards: `shard_state`)."""
        if self.sharded:
            return {"updates": self.updates, "in_shards": True}
        return {"updates": self.updates, "shadow": [s.cpu() for s in self.shadow]}

    def load_state_dict(self, state: dict) -> None:
        """A backup's `state_dict` (sharded or not: a sharded average's weights come from `load_shards` or
        `whole_targets`, here only its count). Full weights from an unsharded run split over sharded ones, each
        process keeping its shard."""
        self.updates = int(state["updates"])
        if "shadow" not in state:
            return
        if len(state["shadow"]) != len(self.params):
            raise ValueError(
                f"the backup's EMA holds {len(state['shadow'])} weights, this run trains {len(self.params)}"
            )
        self.shadow = [
            self._own_share(full, p).to(self.device, torch.float32) for full, p in zip(state["shadow"], self.params)
        ]

    @staticmethod
    def _own_share(full: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
        if not hasattr(param, "to_local"):
            return full
        from torch.distributed.tensor import distribute_tensor

        # Every process holds the full tensor: each keeps its share, nothing is sent (src_data_rank None).
        placed = full.to(param.device, torch.float32)  # the average stays float32, whatever the weights' dtype
        return distribute_tensor(placed, param.device_mesh, param.placements, src_data_rank=None).to_local()

    # -- a sharded average in DCP's shards ----------------------------------------------------------------------------
    def shard_state(self) -> dict[str, torch.Tensor]:
        """The averaged weights as DTensors sharded as the weights (one per trained weight, in the optimizer's order,
        the order a fine-tune's groups have sharded or not), for DCP to write and to read back in place."""
        from torch.distributed.tensor import DTensor

        return {
            str(i): DTensor.from_local(
                shadow.to(p.device), p.device_mesh, p.placements, run_check=False, shape=p.shape, stride=p.stride()
            )
            for i, (shadow, p) in enumerate(zip(self.shadow, self.params))
        }

    def load_shards(self, state: dict[str, torch.Tensor]) -> None:
        """Take the averaged weights DCP read into `shard_state`'s DTensors."""
        self.shadow = [local_shard(state[str(i)]).to(self.device, torch.float32) for i in range(len(self.params))]

    def whole_targets(self) -> dict[str, torch.Tensor]:
        """An unsharded average's weights by the names `shard_state` writes, for DCP to read a sharded backup's average
        into whole, in place."""
        return {str(i): shadow for i, shadow in enumerate(self.shadow)}
