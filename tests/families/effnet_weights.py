"""Seeded weights for an EfficientNet state dict, by key and shape alone.

The stored reference (data/effnet_reference.safetensors) was computed by torchvision's EfficientNetV2-S with these
weights (see generate_effnet_reference.py); the tests give our module the same weights and compare.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


def seeded_state_dict(shapes: Iterable[tuple[str, tuple[int, ...]]], seed: int = 0) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    state: dict[str, torch.Tensor] = {}
    for name, shape in shapes:
        if name.endswith("num_batches_tracked"):
            state[name] = torch.tensor(0)
        elif name.endswith("running_var") or (len(shape) == 1 and name.endswith("weight")):
            state[name] = 0.5 + torch.rand(shape, generator=generator)
        elif len(shape) == 4:
            fan_in = shape[1] * shape[2] * shape[3]
            state[name] = torch.randn(shape, generator=generator) / fan_in**0.5
        else:
            state[name] = 0.1 * torch.randn(shape, generator=generator)
    return state


def seeded_input(shape: tuple[int, ...], seed: int = 1) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))
