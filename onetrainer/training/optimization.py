"""The optimizer and what steps with it, built once the method's parameter groups exist: the LR schedule, the EMA of
the trained weights, the grad scaler and the fused back pass."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from onetrainer.config.enums import EMAMode
from onetrainer.training import stochastic_rounding
from onetrainer.training.devices import grad_scaler
from onetrainer.training.ema import EMA
from onetrainer.training.fused_back_pass import FusedBackPass
from onetrainer.training.optim import create_optimizer, optimizer_spec
from onetrainer.training.processes import scaler_factor
from onetrainer.training.schedules import build_lr_scheduler, warmup_steps_of

if TYPE_CHECKING:
    from onetrainer.config import TrainConfig
    from onetrainer.memory.layer_offload import LayerOffload


@dataclass
class Optimization:
    optimizer: torch.optim.Optimizer
    lr_scheduler: object
    schedule_free: bool  # the optimizer has an evaluation point of its own (`inference_weights`)
    ema: EMA | None
    grad_scaler: object
    fused: FusedBackPass | None  # the fused back pass, when the optimizer settings ask for it
    # Every parameter of the optimizer's groups, listed once: walking the groups each step costs ~0.4 ms.
    params: list[torch.Tensor]

    @contextlib.contextmanager
    def inference_weights(self, use_ema: bool = True) -> Iterator[None]:
        """The weights to sample and save with: the EMA's when it is on; schedule-free optimizers' evaluation point."""
        if self.schedule_free:
            self.optimizer.eval()
        try:
            with self.ema.swapped_in() if (self.ema is not None and use_ema) else contextlib.nullcontext():
                yield
        finally:
            if self.schedule_free:
                self.optimizer.train()


def build_optimization(
    config: TrainConfig,
    param_groups: list[dict],
    device: torch.device,
    world_size: int,
    total_steps: int,
    steps_per_epoch: int,
    offloads: dict[str, LayerOffload],
) -> Optimization:
    """The optimizer of `param_groups` (their learning rates scaled by `learning_rate_scaler` first) and the rest."""
    lr_scale = math.sqrt(scaler_factor(config.learning_rate_scaler.value, config, world_size))
    for group in param_groups:
        group["lr"] *= lr_scale
    warmup = warmup_steps_of(config.learning_rate_warmup_steps, total_steps)
    layout = None
    if optimizer_spec(config.optimizer.optimizer).aux_adam is not None:
        from onetrainer.training.muon import layout_of

        layout = layout_of(config, lr_scale)
    optimizer = create_optimizer(config.optimizer, param_groups, config.learning_rate, warmup, layout)
    if stochastic_rounding.applies(config.optimizer):
        stochastic_rounding.install(optimizer)
    lr_scheduler = build_lr_scheduler(optimizer, config, total_steps, steps_per_epoch)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    ema = None
    if config.ema is not EMAMode.OFF:
        ema_device = device if config.ema is EMAMode.GPU else torch.device("cpu")
        ema = EMA(params, config.ema_decay, config.ema_update_step_interval, ema_device)
    scaler = grad_scaler(device, config.train_dtype, param_groups)
    spec = optimizer_spec(config.optimizer.optimizer)
    fused = None
    if config.optimizer.fused_back_pass:
        fused = FusedBackPass(optimizer, config.clip_grad_norm, spec.steps_each_weight)
    for offload in offloads.values():
        if offload.trained:
            offload.carry_optimizer_state(optimizer)
    return Optimization(optimizer, lr_scheduler, spec.schedule_free, ema, scaler, fused, params)
