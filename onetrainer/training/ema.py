"""An exponential moving average of the trained weights (EMA), kept on the GPU or the CPU.

decay_t = min((1 + t) / (10 + t), decay) with t the number of updates so far: the average follows the weights
quickly at first and settles to the configured decay (a warm-up of the decay).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


class EMA:
    def __init__(self, params: list[torch.nn.Parameter], decay: float, every: int, device: torch.device) -> None:
        self.params = params
        self.decay = decay
        self.every = max(1, every)
        self.device = device
        self.updates = 0
        self.shadow = [p.detach().to(device, torch.float32, copy=True) for p in params]

    def current_decay(self) -> float:
        return min((1 + self.updates) / (10 + self.updates), self.decay)

    @torch.no_grad()
    def after_step(self, global_step: int) -> bool:
        """Update the average every `every` optimizer steps; returns whether it did."""
        if global_step % self.every:
            return False
        decay = self.current_decay()
        for shadow, param in zip(self.shadow, self.params):
            shadow.mul_(decay).add_(param.detach().to(shadow.device, torch.float32), alpha=1.0 - decay)
        self.updates += 1
        return True

    @contextlib.contextmanager
    def swapped_in(self) -> Iterator[None]:
        """Use the averaged weights inside the block (sampling, saving), the trained ones after it."""
        saved = [p.detach().clone() for p in self.params]
        self.copy_to_params()
        try:
            yield
        finally:
            with torch.no_grad():
                for param, value in zip(self.params, saved):
                    param.copy_(value)

    @torch.no_grad()
    def copy_to_params(self) -> None:
        for shadow, param in zip(self.shadow, self.params):
            param.copy_(shadow.to(param.device, param.dtype))

    def state_dict(self) -> dict:
        return {"updates": self.updates, "shadow": [s.cpu() for s in self.shadow]}

    def load_state_dict(self, state: dict) -> None:
        self.updates = int(state["updates"])
        self.shadow = [s.to(self.device, torch.float32) for s in state["shadow"]]
