"""The per-pixel loss functions, the mask weights of masked training and the reduction to one loss per sample."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class LossSettings:
    """The strength of each per-pixel loss function (0: off) and Huber's δ. Built once per run from the config
    (`training/settings.py`)."""

    mse_strength: float
    mae_strength: float
    huber_strength: float
    huber_delta: float
    log_cosh_strength: float


def per_pixel_loss(prediction: torch.Tensor, target: torch.Tensor, settings: LossSettings) -> torch.Tensor:
    """The sum of the enabled loss functions, per element (not reduced)."""
    prediction = prediction.float()
    target = target.float()
    terms = []
    if settings.mse_strength:
        terms.append((settings.mse_strength, F.mse_loss(prediction, target, reduction="none")))
    if settings.mae_strength:
        terms.append((settings.mae_strength, F.l1_loss(prediction, target, reduction="none")))
    if settings.huber_strength:
        huber = F.huber_loss(prediction, target, reduction="none", delta=settings.huber_delta)
        terms.append((settings.huber_strength, huber))
    if settings.log_cosh_strength:
        terms.append((settings.log_cosh_strength, _log_cosh(prediction - target)))
    loss = None
    for strength, term in terms:
        # 1·x and 0 + x are x exactly: a lone term at strength 1 is the loss itself, without two more operators (and
        # their backward nodes) every step.
        term = term if strength == 1 else strength * term
        loss = term if loss is None else loss + term
    return loss if loss is not None else torch.zeros_like(prediction)


def _log_cosh(diff: torch.Tensor) -> torch.Tensor:
    # log(cosh(x)) = |x| + log1p(exp(-2|x|)) - log(2), stable for large |x|.
    return diff.abs() + torch.log1p(torch.exp(-2 * diff.abs())) - torch.log(torch.tensor(2.0))


def latent_masks(masks: torch.Tensor, latent_shape: torch.Size, counts=None) -> torch.Tensor:
    """Pixel masks at the latents' size, by area: [B, 1, H, W] → [B, 1, h, w] for image latents [B, C, h, w]; for a
    video's latents [B, C, f, h, w] a sample's one mask ([B, 1, H, W]) weighs every latent frame alike
    ([B, 1, 1, h, w]), and per-frame masks ([B, 1, F, H, W]) are pooled over the frames each latent frame holds.

    Which frames a latent frame holds follows the family's VAE (`counts`, a `FrameCounts`: `step`·k + `offset`; by
    default the causal VAEs' 4k + 1): latent frame 0 ← frames 0 … offset-1, latent frame k ≥ 1 ← the `step` frames
    offset + (k-1)·step … offset + k·step - 1 (Wan: 0 ← 0; k ← 4k-3 … 4k). The pooling is the mean (as the area pooling
    of the pixels is), so a latent frame whose object shows in two of its four frames weighs half; frame counts that do
    not match that layout (e.g. a test's) are pooled by area over time."""
    if len(latent_shape) == 4 or masks.dim() == 4:
        small = F.interpolate(masks, size=tuple(latent_shape[-2:]), mode="area")
        return small if len(latent_shape) == 4 else small[:, :, None]
    groups = _frame_groups(masks.shape[2], latent_shape[2], counts)
    if groups is None:
        return F.interpolate(masks, size=tuple(latent_shape[-3:]), mode="area")
    pooled = torch.stack([masks[:, :, start:end].mean(dim=2) for start, end in groups], dim=2)
    return F.interpolate(pooled, size=tuple(latent_shape[-3:]), mode="area")


def _frame_groups(frames: int, latent_frames: int, counts) -> list[tuple[int, int]] | None:
    """The [start, end) frames each latent frame holds, per `latent_masks`; None when `frames` is not the count the VAE
    turns into `latent_frames`."""
    step, offset = (counts.step, counts.offset) if counts is not None else (4, 1)
    if frames != offset + (latent_frames - 1) * step:
        return None
    return [(0, offset)] + [(offset + (k - 1) * step, offset + k * step) for k in range(1, latent_frames)]


def mask_weights(masks: torch.Tensor, keep_unmasked: torch.Tensor, unmasked_weight: float) -> torch.Tensor:
    """Per-pixel loss weights w = max(m, unmasked_weight); samples drawn as unmasked train everywhere (m = 1)."""
    rows = keep_unmasked.view(-1, *([1] * (masks.dim() - 1)))
    masks = torch.where(rows, torch.ones_like(masks), masks)
    return masks.clamp(min=unmasked_weight, max=1.0)


def reduce_loss(pixel_loss: torch.Tensor, weights: torch.Tensor | None, normalize: bool) -> torch.Tensor:
    """Per-sample loss: the (weighted) mean over channels and pixels (and a video's frames); optionally divided by the
    mean weight."""
    dims = tuple(range(1, pixel_loss.dim()))
    if weights is None:
        return pixel_loss.mean(dim=dims)
    weighted = (pixel_loss * weights).mean(dim=dims)
    if normalize:
        weighted = weighted / weights.expand_as(pixel_loss).mean(dim=dims).clamp(min=1e-8)
    return weighted
