"""The noise a training step adds: Gaussian noise with the optional offset noise and input perturbation.

Drawn on the CPU from an explicit generator, so the same inputs give the same noise on every device (resume,
distributed runs and the golden tests depend on it).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DrawSettings:
    """How strong the offset noise and the input perturbation are (0: none). Built once per run from the config
    (`training/settings.py`)."""

    offset_noise_weight: float
    perturbation_noise_weight: float


def sample_noise(latents: torch.Tensor, generator: torch.Generator, settings: DrawSettings) -> torch.Tensor:
    """Gaussian noise, plus offset noise (a per-sample, per-channel constant).

    Drawn on the CPU from `generator` (a CPU generator), so a run gives the same noise on every device.
    """
    noise = torch.randn(latents.shape, generator=generator, dtype=torch.float32)
    if settings.offset_noise_weight > 0:
        shape = (latents.shape[0], latents.shape[1]) + (1,) * (latents.dim() - 2)  # a video's: one for all frames
        offset = torch.randn(shape, generator=generator, dtype=torch.float32)
        noise = noise + settings.offset_noise_weight * offset
    return noise.to(latents.device, latents.dtype)


def perturb_noise(noise: torch.Tensor, generator: torch.Generator, settings: DrawSettings) -> torch.Tensor:
    """Input perturbation: the model sees slightly different noise than its target (arXiv 2301.11706)."""
    if settings.perturbation_noise_weight <= 0:
        return noise
    extra = torch.randn(noise.shape, generator=generator, dtype=torch.float32).to(noise.device, noise.dtype)
    return noise + settings.perturbation_noise_weight * extra
