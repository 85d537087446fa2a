"""The loss weighting by noise level: min-SNR-γ, debiased estimation and P2, from the schedule's SNR; SIGMA (σ_t) for
flow-velocity models.

Each weighting is defined on the x₀ error; a model that predicts ε, v or a flow velocity has a squared error that is
the x₀ error times a factor of the SNR (`PredictionType.x0_error_factor`), which the weightings divide out. For ε and
v this is what OneTrainer computes (min(SNR, γ)/SNR, min(SNR, γ)/(SNR + 1), …).

On a flow schedule (σ in [1/T, 1]) the SNR ((1 − σ)/σ)² is at most (T − 1)² and 0 at σ = 1, and every weighting
stays finite there without a further clamp: min-SNR-γ gives min(SNR, γ)·σ² (0 at pure noise, where the x₀ error
tells nothing), debiased estimation clips the SNR as for the others, P2 gives (1 + 1/σ²)^−γ.
SIGMA is OneTrainer's flow-matching weighting: the loss times the sample's σ.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from onetrainer.config.enums import LossWeight
from onetrainer.noise.prediction import PredictionType

if TYPE_CHECKING:
    from onetrainer.noise.schedule import NoiseSchedule

# Debiased estimation clips the SNR, so that 1/√SNR stays finite at the cleanest timesteps.
DEBIASED_MAX_SNR = 1000.0


def timestep_weights(fn: LossWeight, strength: float, schedule: NoiseSchedule, times: torch.Tensor) -> torch.Tensor:
    """Loss weight per sample at `times` (float32): `strength` is γ for min-SNR-γ and P2's exponent."""
    if fn is LossWeight.CONSTANT:
        return torch.ones(times.shape, device=times.device)
    snr = schedule.snr(times)
    factor = schedule.prediction.x0_error_factor
    if fn is LossWeight.MIN_SNR_GAMMA:
        return torch.minimum(snr, torch.full_like(snr, strength)) / factor(snr)
    if fn is LossWeight.DEBIASED_ESTIMATION:
        return 1.0 / torch.sqrt(factor(torch.clamp(snr, max=DEBIASED_MAX_SNR)))
    if fn is LossWeight.P2:
        return (1.0 + factor(snr)) ** (-strength)
    if fn is LossWeight.SIGMA and schedule.prediction is PredictionType.FLOW:
        return schedule.scales(times)[1].float()
    raise ValueError(f"loss weight {fn.value} does not apply to this model")
