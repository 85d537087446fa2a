"""Latents normalised by the batch-norm statistics a VAE carries over 2x2 patches of its latents (Flux.2's VAE,
`AutoencoderKLFlux2`, which Flux.2 and ERNIE-Image share): `bn.running_mean` and `bn.running_var` are per channel of
the 2x2-patchified latents (4C channels), so a [B, C, h, w] latent is patchified, normalised per patch channel and
unpatchified again. The latents stay [B, C, h, w] (masks and caches at the VAE's 1/8 size, as OneTrainer keeps them);
a family patchifies them for its transformer where it takes patches (`patchify`, the pipelines' `_patchify_latents`).
"""

from __future__ import annotations

import torch

from onetrainer.util.part_dtypes import compute_weight

PATCH = 2  # latent pixels per patch side


def patchify(latents: torch.Tensor) -> torch.Tensor:
    """[B, C, h, w] → [B, 4C, h/2, w/2], channels (c, row, column) in order (the pipelines' `_patchify_latents`)."""
    b, c, h, w = latents.shape
    patches = latents.view(b, c, h // PATCH, PATCH, w // PATCH, PATCH).permute(0, 1, 3, 5, 2, 4)
    return patches.reshape(b, c * PATCH * PATCH, h // PATCH, w // PATCH)


def unpatchify(patches: torch.Tensor) -> torch.Tensor:
    """The inverse of `patchify`."""
    b, c4, h, w = patches.shape
    c = c4 // (PATCH * PATCH)
    latents = patches.reshape(b, c, PATCH, PATCH, h, w).permute(0, 1, 4, 2, 5, 3)
    return latents.reshape(b, c, h * PATCH, w * PATCH)


def batch_norm_statistics(
    vae: torch.nn.Module, like: torch.Tensor, eps: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The VAE's per-channel mean and standard deviation of its 2x2-patchified latents, [1, 4C, 1, 1], on `like`'s
    device and dtype; `eps` is added to the variance (default: the VAE config's `batch_norm_eps`)."""
    eps = vae.config.batch_norm_eps if eps is None else eps
    mean = vae.bn.running_mean.view(1, -1, 1, 1).to(like.device, like.dtype)
    std = torch.sqrt(vae.bn.running_var.view(1, -1, 1, 1) + eps).to(like.device, like.dtype)
    return mean, std


def normalise_latents(vae: torch.nn.Module, latents: torch.Tensor, eps: float | None = None) -> torch.Tensor:
    """The VAE's latents [B, C, h, w] normalised by its batch-norm statistics, which are per patch channel."""
    patches = patchify(latents)
    mean, std = batch_norm_statistics(vae, patches, eps)
    return unpatchify((patches - mean) / std)


def denormalise_latents(vae: torch.nn.Module, latents: torch.Tensor, eps: float | None = None) -> torch.Tensor:
    """The inverse of `normalise_latents`: what the VAE decodes."""
    patches = patchify(latents)
    mean, std = batch_norm_statistics(vae, patches, eps)
    return unpatchify(patches * std + mean)


def encode_normalised(vae: torch.nn.Module, pixels: torch.Tensor, eps: float | None = None) -> torch.Tensor:
    """Pixels [B, 3, H, W] in [-1, 1] → the mode of the VAE's distribution, normalised: [B, C, H/8, W/8]."""
    weight = compute_weight(vae)
    latents = vae.encode(pixels.to(weight.device, weight.dtype)).latent_dist.mode()
    return normalise_latents(vae, latents, eps)
