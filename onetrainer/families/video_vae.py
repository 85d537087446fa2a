"""What the families on a causal video VAE share (`AutoencoderKLQwenImage`, Wan's 16-channel VAE, and `AutoencoderKLWan`
itself, with per-channel latent statistics; `AutoencoderKLHunyuanVideo`, with one scaling factor): clips
[B, 3, F, H, W] encoded into 5-D latents, or still images encoded as one-frame videos, their latents normalised per
channel or scaled (the video families; Qwen-Image and its Edit models, Krea 2 on single frames)."""

from __future__ import annotations

import torch

from onetrainer.util.part_dtypes import compute_weight


def encode_frames(vae: torch.nn.Module, pixels: torch.Tensor) -> torch.Tensor:
    """Pixels [B, 3, H, W] in [-1, 1] → the video VAE's latents of each as a one-frame video [B, 16, h, w], normalised
    per channel by the VAE's `latents_mean` / `latents_std` (the inverse of what the pipelines decode)."""
    return encode_clips(vae, pixels[:, :, None])[:, :, 0]


def encode_clips(vae: torch.nn.Module, pixels: torch.Tensor) -> torch.Tensor:
    """Clips [B, 3, F, H, W] in [-1, 1] (a still [B, 3, H, W] is a one-frame clip) → the video VAE's latents
    [B, C, f, h, w], normalised per channel by the VAE's `latents_mean` / `latents_std`, or, for a VAE without them,
    scaled by its `scaling_factor` (the inverse of what the video pipelines decode)."""
    weight = compute_weight(vae)
    frames = pixels.to(weight.device, weight.dtype)
    if frames.dim() == 4:
        frames = frames[:, :, None]
    latents = vae.encode(frames).latent_dist.mode()
    if getattr(vae.config, "latents_mean", None) is None:  # one scaling factor (HunyuanVideo's VAE)
        return latents * vae.config.scaling_factor
    shape = (1, -1, 1, 1, 1)
    mean = torch.tensor(vae.config.latents_mean, device=latents.device, dtype=latents.dtype).view(shape)
    std = torch.tensor(vae.config.latents_std, device=latents.device, dtype=latents.dtype).view(shape)
    return (latents - mean) / std
