"""The optimizer tests' shared harness: seeded parameters and gradients, steps through an optimizer, and the check
that a state dict saved as a backup saves it (torch.save, a weights-only load, a fresh optimizer) continues exactly."""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence

import torch


def tiny_params(seed: int = 0, shapes: Sequence[tuple[int, ...]] = ((4, 64), (64, 4), (16,))) -> list:
    """Seeded parameters of `shapes` (by default a LoRA's down and up projections and a bias)."""
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=g)) for s in shapes]


def gradients(step: int, params) -> list[torch.Tensor]:
    """The gradients of step `step`: the same for every optimizer compared."""
    g = torch.Generator().manual_seed(100 + step)
    return [torch.randn(p.shape, generator=g) for p in params]


def take_steps(optimizer, params, steps: range) -> None:
    for step in steps:
        for p, g in zip(params, gradients(step, params)):
            p.grad = g.clone()
        optimizer.step()
        optimizer.zero_grad()


def assert_resumes_exactly(make: Callable[[list], torch.optim.Optimizer], fresh: Callable[[], list]) -> None:
    """Six steps straight equal three, a backup's save and load of the state into a new optimizer (`make` of the
    parameters), and three more; `fresh` gives a new set of the same parameters."""
    straight = fresh()
    take_steps(make(straight), straight, range(6))
    params = fresh()
    first = make(params)
    take_steps(first, params, range(3))
    buffer = io.BytesIO()
    torch.save(first.state_dict(), buffer)
    buffer.seek(0)
    resumed = make(params)
    resumed.load_state_dict(torch.load(buffer, weights_only=True))
    take_steps(resumed, params, range(3, 6))
    for a, b in zip(params, straight, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
