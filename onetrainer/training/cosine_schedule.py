"""The continuous cosine noise schedule of Würstchen v2 and Stable Cascade, as pure functions.

t is a ratio in (0, 1] (the priors take it as their `r` / `timestep_ratio` input):
ᾱ(t) = clamp(cos²((t + s)/(1 + s)·π/2) / cos²(s/(1 + s)·π/2), 1e-4, 0.9999) with s = 0.008, as diffusers'
`DDPMWuerstchenScheduler` (scaler 1) and the original trainers compute it. Training draws one of 10000 bins from the
configured timestep distribution and remaps it per model before noising.
"""

from __future__ import annotations

import math

import torch

S = 0.008
ALPHA_BAR_MIN = 1e-4
ALPHA_BAR_MAX = 0.9999
TIMESTEP_BINS = 10000
# What validation and other deterministic passes use (OneTrainer's choice).
DETERMINISTIC_T = 0.5
_ALPHA_BAR_0 = math.cos(S / (1 + S) * math.pi / 2) ** 2


def alpha_bar(t: torch.Tensor) -> torch.Tensor:
    """ᾱ(t), computed in float32 or wider whatever the dtype of t (fp16 loses the ends of the schedule)."""
    t = t.to(torch.promote_types(t.dtype, torch.float32))
    return (torch.cos((t + S) / (1 + S) * (math.pi / 2)) ** 2 / _ALPHA_BAR_0).clamp(ALPHA_BAR_MIN, ALPHA_BAR_MAX)


def t_from_bins(bins: torch.Tensor) -> torch.Tensor:
    """Bin k in [0, 9999] → t = (k + 1)/10000, so t is never 0 (OneTrainer's discretisation)."""
    return (bins.to(torch.float32) + 1) / TIMESTEP_BINS


def bins_from_unit(unit: torch.Tensor) -> torch.Tensor:
    """A draw in [0, 1] from the timestep distribution → its bin in [0, 9999]."""
    return (unit * TIMESTEP_BINS).floor().clamp(0, TIMESTEP_BINS - 1).long()


def wuerstchen_t(t: torch.Tensor) -> torch.Tensor:
    """Würstchen v2 trains slightly past t = 1 in the draw and clamps: clamp(1.08·t + 0.001, 0.001, 1)."""
    return (t * 1.08 + 0.001).clamp(0.001, 1.0)


def cascade_t(t: torch.Tensor) -> torch.Tensor:
    """Stable Cascade: clamp(t + 0.001, 0.001, 1)."""
    return (t + 0.001).clamp(0.001, 1.0)


def _per_sample(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return values.reshape(-1, *([1] * (like.ndim - 1))).to(like.dtype)


def add_noise(x0: torch.Tensor, noise: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """x_t = √ᾱ(t)·x0 + √(1 − ᾱ(t))·ε, one t per sample."""
    a = alpha_bar(t)
    return _per_sample(a.sqrt(), x0) * x0 + _per_sample((1 - a).sqrt(), x0) * noise


def snr(t: torch.Tensor) -> torch.Tensor:
    """The signal-to-noise ratio ᾱ/(1 − ᾱ) at t (what the loss weightings — P2, min-SNR, debiased — read)."""
    a = alpha_bar(t)
    return a / (1 - a)


def predicted_x0(x_t: torch.Tensor, predicted_noise: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """The clean latents implied by an ε prediction (for losses and previews that need x0)."""
    a = alpha_bar(t)
    return (x_t - _per_sample((1 - a).sqrt(), x_t) * predicted_noise) / _per_sample(a.sqrt(), x_t)
