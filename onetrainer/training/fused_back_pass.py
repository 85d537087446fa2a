"""The fused back pass: each trained weight is updated as soon as its gradient is complete, during the backward pass,
and its gradient freed at once, so a fine-tune never holds the whole model's gradients (OneTrainer's
`fused_back_pass`). It is also what lets layer offloading move trained blocks: a block's weights are updated while
the block is on the device, and leave it updated (`memory/layer_offload.py`).

The optimizer stays one ordinary torch optimizer (its state, its state dict in backups, the LR schedule's groups):
for one weight's update its step is shown only that weight, in a copy of the weight's group. That is exact for the
optimizers whose update of a weight depends on that weight's gradient and state alone (`PER_WEIGHT_OPTIMIZERS`);
optimizers that look at all weights together (Prodigy's and D-Adaptation's step size, schedule-free averaging, LAMB's
and LARS' trust ratios over groups) cannot be fused this way. Those whose class steps one weight itself (adv-optm's,
Prodigy + schedule-free: `steps_each_weight` in the optimizer table) are called as OneTrainer calls them: each weight's
`step_parameter` in its own group, then, once the backward pass is done, `step()` (every stepped weight's gradient is
gone by then), which finishes the step (Prodigy's new step size). Gradient clipping applies to each weight's gradient
on its own: the norm of the whole model's gradient is never available.
"""

from __future__ import annotations

import weakref

import torch

from onetrainer.config.optimizers import FUSABLE_OPTIMIZERS, PER_WEIGHT_OPTIMIZERS

__all__ = ["FUSABLE_OPTIMIZERS", "PER_WEIGHT_OPTIMIZERS", "FusedBackPass"]


class FusedBackPass:
    """Hooks on every trained weight of `optimizer` that step it when its gradient has accumulated, while `stepping`
    (the trainer turns it on for the last micro-batch of a step: earlier ones accumulate as usual)."""

    def __init__(
        self, optimizer: torch.optim.Optimizer, clip_grad_norm: float | None = None, steps_each_weight: bool = False
    ) -> None:
        self.optimizer = optimizer
        self.steps_each_weight = steps_each_weight  # the class's own `step_parameter` and finishing `step()`
        self.clip_grad_norm = clip_grad_norm
        self.stepping = False
        self.updates = 0  # weights updated since the trainer last looked (a step with none trained nothing)
        self._group_of: dict[torch.Tensor, dict] = {}
        self._index_of: dict[torch.Tensor, int] = {}
        self._handles = []
        # The hooks hold this object weakly: a weight's hooks are not followed by Python's garbage collector, and a
        # strong reference (weight -> hook -> optimizer -> weight) would keep the whole model alive after the run.
        this = weakref.ref(self)

        def update(param: torch.Tensor) -> None:
            fused = this()
            if fused is not None:
                fused._update(param)

        for group in optimizer.param_groups:
            for index, param in enumerate(group["params"]):
                if param.requires_grad and param not in self._group_of:
                    self._group_of[param] = group
                    self._index_of[param] = index
                    self._handles.append(param.register_post_accumulate_grad_hook(update))

    def _update(self, param: torch.Tensor) -> None:
        if not self.stepping:
            return
        if self.clip_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_([param], self.clip_grad_norm)
        if self.steps_each_weight:
            self.optimizer.step_parameter(param, self._group_of[param], self._index_of[param])
            param.grad = None
            self.updates += 1
            return
        groups = self.optimizer.param_groups
        # Shown one weight in a copy of its group (the LR schedule's current rate included), the optimizer steps that
        # weight only, whatever gradients other weights hold from earlier micro-batches.
        self.optimizer.param_groups = [{**self._group_of[param], "params": [param]}]
        try:
            self.optimizer.step()
        finally:
            self.optimizer.param_groups = groups
        param.grad = None
        self.updates += 1

    def finish(self) -> None:
        """After the last micro-batch's backward pass: stop stepping, and let an optimizer that steps each weight itself
        finish its step (its stepped weights have no gradient left; one without a hook's call steps now)."""
        self.stepping = False
        if self.steps_each_weight:
            self.optimizer.step()

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
