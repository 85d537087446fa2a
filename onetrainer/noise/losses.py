"""The per-pixel loss functions, the mask weights of masked training and the reduction to one loss per sample."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from onetrainer.config import TrainConfig


def per_pixel_loss(prediction: torch.Tensor, target: torch.Tensor, config: TrainConfig) -> torch.Tensor:
    """The sum of the enabled loss functions, per element (not reduced)."""
    prediction = prediction.float()
    target = target.float()
    loss = torch.zeros_like(prediction)
    if config.mse_strength:
        loss = loss + config.mse_strength * F.mse_loss(prediction, target, reduction="none")
    if config.mae_strength:
        loss = loss + config.mae_strength * F.l1_loss(prediction, target, reduction="none")
    if config.huber_strength:
        loss = loss + config.huber_strength * F.huber_loss(
            prediction, target, reduction="none", delta=config.huber_delta
        )
    if config.log_cosh_strength:
        diff = prediction - target
        # log(cosh(x)) = |x| + log1p(exp(-2|x|)) - log(2), stable for large |x|.
        log_cosh = diff.abs() + torch.log1p(torch.exp(-2 * diff.abs())) - torch.log(torch.tensor(2.0))
        loss = loss + config.log_cosh_strength * log_cosh
    return loss


def mask_weights(masks: torch.Tensor, keep_unmasked: torch.Tensor, unmasked_weight: float) -> torch.Tensor:
    """Per-pixel loss weights w = max(m, unmasked_weight); samples drawn as unmasked train everywhere (m = 1)."""
    masks = torch.where(keep_unmasked.view(-1, 1, 1, 1), torch.ones_like(masks), masks)
    return masks.clamp(min=unmasked_weight, max=1.0)


def reduce_loss(pixel_loss: torch.Tensor, weights: torch.Tensor | None, normalize: bool) -> torch.Tensor:
    """Per-sample loss: the (weighted) mean over channels and pixels; optionally divided by the mean weight."""
    if weights is None:
        return pixel_loss.mean(dim=(1, 2, 3))
    weighted = (pixel_loss * weights).mean(dim=(1, 2, 3))
    if normalize:
        weighted = weighted / weights.mean(dim=(1, 2, 3)).clamp(min=1e-8)
    return weighted
