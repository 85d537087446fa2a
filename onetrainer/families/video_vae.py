"""What the families on Qwen-Image's video VAE (`AutoencoderKLQwenImage`, Wan's 16-channel VAE) share: still images
encoded as one-frame videos, their latents normalised per channel (Qwen-Image and its Edit models, Krea 2)."""

from __future__ import annotations

import torch

from onetrainer.util.part_dtypes import compute_weight


def encode_frames(vae: torch.nn.Module, pixels: torch.Tensor) -> torch.Tensor:
    """Pixels [B, 3, H, W] in [-1, 1] → the video VAE's latents of each as a one-frame video [B, 16, h, w], normalised
    per channel by the VAE's `latents_mean` / `latents_std` (the inverse of what the pipelines decode)."""
    weight = compute_weight(vae)
    frames = pixels.to(weight.device, weight.dtype)[:, :, None]
    latents = vae.encode(frames).latent_dist.mode()[:, :, 0]
    shape = (1, -1, 1, 1)
    mean = torch.tensor(vae.config.latents_mean, device=latents.device, dtype=latents.dtype).view(shape)
    std = torch.tensor(vae.config.latents_std, device=latents.device, dtype=latents.dtype).view(shape)
    return (latents - mean) / std
