"""Stochastic rounding of optimizer updates into BFLOAT_16 weights (OneTrainer's `optimizer.stochastic_rounding`).

A bfloat16 weight has 8 bits of precision: an update smaller than half the gap to the next value is lost when the
new weight is rounded to the nearest one, so a fine-tune at a small learning rate barely moves its BFLOAT_16 weights.
Here each BFLOAT_16 weight is stepped on its own in float32 (the weight, its gradient and its state upcast for that
step only) and the result written back rounded up or down at random, with the probability of its distance to each:
on average the update is kept, however small.

The optimizer is shown one weight at a time in a copy of its group (as the fused back pass shows it), which is exact
for the optimizers that update each weight from its own gradient and state (`PER_WEIGHT_OPTIMIZERS`); weights of other
dtypes step together as usual. The state keeps the dtype it has: tensors the first step creates are stored as the
optimizer would store them for the BFLOAT_16 weight (shaped like the weight: in its dtype), and rounded to the nearest
value; the computation itself is float32.
"""

from __future__ import annotations

import types
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from onetrainer.config.optimizer_config import TrainOptimizerConfig

ROUNDED = torch.bfloat16
_KEEP_UPPER_HALF = -(1 << 16)  # 0xFFFF0000 as an int32: a float32's sign, exponent and first 7 mantissa bits


def round_stochastically(values: torch.Tensor) -> torch.Tensor:
    """float32 `values` as bfloat16, each rounded away from zero with the probability of the part of its magnitude
    below bfloat16's precision (random 16 bits added to the float32's lower half, which is then cut off)."""
    bits = values.float().contiguous().view(torch.int32)
    noise = torch.randint(0, 1 << 16, bits.shape, dtype=torch.int32, device=bits.device)
    return ((bits + noise) & _KEEP_UPPER_HALF).view(torch.float32).to(ROUNDED)


def install(optimizer: torch.optim.Optimizer) -> None:
    """Make `optimizer.step` step its BFLOAT_16 weights one at a time in float32, rounding them back stochastically.
    Install before an LR scheduler is built on the optimizer (it wraps `step` too)."""
    plain_step = optimizer.step

    def step(optimizer: torch.optim.Optimizer, closure=None):
        groups = optimizer.param_groups
        rounded = [p for group in groups for p in group["params"] if p.grad is not None and p.dtype == ROUNDED]
        if not rounded:
            return plain_step(closure)
        try:
            others = [
                {**group, "params": [p for p in group["params"] if p.dtype != ROUNDED]}
                for group in groups
                if any(p.dtype != ROUNDED for p in group["params"])
            ]
            if others:
                optimizer.param_groups = others
                plain_step()
            for group in groups:
                for param in group["params"]:
                    if param.grad is not None and param.dtype == ROUNDED:
                        optimizer.param_groups = [{**group, "params": [param]}]
                        _step_in_float32(optimizer, plain_step, param)
        finally:
            optimizer.param_groups = groups
        return None

    # A method of this optimizer, as torch's LR schedulers expect to find (they wrap its function).
    optimizer.step = types.MethodType(step, optimizer)


def _step_in_float32(optimizer: torch.optim.Optimizer, plain_step, param: torch.Tensor) -> None:
    stored, grad = param.data, param.grad
    state = optimizer.state[param]
    kept = {key: value.dtype for key, value in state.items() if _is_float_tensor(value)}
    for key, dtype in kept.items():
        if dtype != torch.float32:
            state[key] = state[key].float()
    param.data = stored.float()
    param.grad = grad.float()
    try:
        plain_step()
    finally:
        updated = param.data
        param.data = stored
        param.grad = grad
    stored.copy_(round_stochastically(updated))
    for key, value in state.items():
        if not _is_float_tensor(value):
            continue
        dtype = kept.get(key, stored.dtype if value.shape == stored.shape else value.dtype)
        if value.dtype != dtype:
            state[key] = value.to(dtype)


def _is_float_tensor(value) -> bool:
    return isinstance(value, torch.Tensor) and value.is_floating_point()


def applies(optimizer: TrainOptimizerConfig) -> bool:
    """Whether an optimizer block rounds its BFLOAT_16 updates stochastically: asked for, with an optimizer that steps
    each weight on its own."""
    from onetrainer.config.optimizers import PER_WEIGHT_OPTIMIZERS

    return bool(optimizer.stochastic_rounding) and optimizer.optimizer in PER_WEIGHT_OPTIMIZERS
