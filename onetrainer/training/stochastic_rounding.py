"""Stochastic rounding of optimizer updates into BFLOAT_16 weights (OneTrainer's `optimizer.stochastic_rounding`).

A bfloat16 weight has 8 bits of precision: an update smaller than half the gap to the next value is lost when the
new weight is rounded to the nearest one, so a fine-tune at a small learning rate barely moves its BFLOAT_16 weights.
Here the BFLOAT_16 weights are stepped in float32 (each weight, its gradient and its state upcast for that step only)
and the result written back rounded up or down at random, with the probability of its distance to each:
on average the update is kept, however small.

The optimizer is shown a few weights at a time (up to `CHUNK_ELEMENTS`) in a copy of their group (as the fused back
pass shows it one), which is exact for the optimizers that update each weight from its own gradient and state
(`PER_WEIGHT_OPTIMIZERS`); weights of other dtypes step together as usual. The state keeps the dtype it has: tensors
the first step creates are stored as the optimizer would store them for the BFLOAT_16 weight (shaped like the weight:
in its dtype), rounded to the nearest value; the computation itself is float32.
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
    """Make `optimizer.step` step its BFLOAT_16 weights in float32, a few at a time, rounding them back stochastically.
    Install before an LR scheduler is built on the optimizer (it wraps `step` too)."""
    plain_step = optimizer.step

    def step(optimizer: torch.optim.Optimizer, closure=None):
        groups = optimizer.param_groups
        if not any(p.grad is not None and p.dtype == ROUNDED for group in groups for p in group["params"]):
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
                rounded = [p for p in group["params"] if p.grad is not None and p.dtype == ROUNDED]
                for chunk in _chunks(rounded):
                    optimizer.param_groups = [{**group, "params": chunk}]
                    _step_in_float32(optimizer, plain_step, chunk)
        finally:
            optimizer.param_groups = groups
        return None

    # A method of this optimizer, as torch's LR schedulers expect to find (they wrap its function).
    optimizer.step = types.MethodType(step, optimizer)


# Weights stepped together in float32: few optimizer calls for many small weights (adapters, norms, biases), and a
# bounded float32 copy (weights, gradients and state of 16 M elements: about 256 MiB with AdamW); a larger weight
# steps alone.
CHUNK_ELEMENTS = 1 << 24


def _chunks(params: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    chunks: list[list[torch.Tensor]] = []
    size = CHUNK_ELEMENTS
    for param in params:
        if size + param.numel() > CHUNK_ELEMENTS:
            chunks.append([])
            size = 0
        chunks[-1].append(param)
        size += param.numel()
    return chunks


def _step_in_float32(optimizer: torch.optim.Optimizer, plain_step, params: list[torch.Tensor]) -> None:
    stored = [(param.data, param.grad) for param in params]
    kept = []
    for param, (weight, grad) in zip(params, stored):
        state = optimizer.state[param]
        kept.append({key: value.dtype for key, value in state.items() if _is_float_tensor(value)})
        for key, dtype in kept[-1].items():
            if dtype != torch.float32:
                state[key] = state[key].float()
        param.data = weight.float()
        param.grad = grad.float()
    try:
        plain_step()
    finally:
        updated = [param.data for param in params]
        for param, (weight, grad) in zip(params, stored):
            param.data = weight
            param.grad = grad
    for param, (weight, _), new, dtypes in zip(params, stored, updated, kept):
        weight.copy_(round_stochastically(new))
        state = optimizer.state[param]
        for key, value in state.items():
            if not _is_float_tensor(value):
                continue
            dtype = dtypes.get(key, weight.dtype if value.shape == weight.shape else value.dtype)
            if value.dtype != dtype:
                state[key] = value.to(dtype)


def _is_float_tensor(value) -> bool:
    return isinstance(value, torch.Tensor) and value.is_floating_point()


def applies(optimizer: TrainOptimizerConfig) -> bool:
    """Whether an optimizer block rounds its BFLOAT_16 updates stochastically: asked for, with an optimizer that steps
    each weight on its own."""
    from onetrainer.config.optimizers import OPTIMIZERS, PER_WEIGHT_OPTIMIZERS

    spec = OPTIMIZERS.get(optimizer.optimizer)
    if spec is not None and spec.rounds_itself:  # adv_optm: its own argument
        return False
    return bool(optimizer.stochastic_rounding) and optimizer.optimizer in PER_WEIGHT_OPTIMIZERS


def rounds(optimizer: TrainOptimizerConfig) -> bool:
    """Whether BFLOAT_16 updates round stochastically with this block: here (`applies`), or in the optimizer's class
    (adv-optm's, Prodigy + schedule-free), where an unset value takes the table's default (on)."""
    from onetrainer.config.optimizers import OPTIMIZERS

    row = OPTIMIZERS.get(optimizer.optimizer)
    if row is not None and row.rounds_itself:
        value = optimizer.stochastic_rounding
        return bool(row.defaults["stochastic_rounding"] if value is None else value)
    return applies(optimizer)
