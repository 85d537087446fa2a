"""What a denoiser predicts, and what it hands back to the trainer."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

import torch


class PredictionType(Enum):
    """What the denoiser outputs, and so what it learns. With x_t = α·x₀ + σ·ε:

    - EPSILON: the noise ε;
    - V: the velocity α·ε − σ·x₀ (variance-preserving schedules, α² + σ² = 1);
    - FLOW: the rectified-flow velocity ε − x₀ (x_t = (1−σ)·x₀ + σ·ε, so α + σ = 1).

    The values are diffusers' `prediction_type` strings where diffusers has one.
    """

    EPSILON = "epsilon"
    V = "v_prediction"
    FLOW = "flow_prediction"

    def x0_error_factor(self, snr: torch.Tensor) -> torch.Tensor:
        """‖error of this target‖² / ‖error of x₀‖² at a given SNR = α²/σ² (x_t fixed, the x₀ estimate off by δ).

        ε = (x_t − α·x₀)/σ, so an x₀ error δ is an ε error −(α/σ)·δ: factor SNR. v = α·ε − σ·x₀ moves by
        −(α²+σ²)/σ·δ = −δ/σ: factor 1/σ² = SNR + 1. ε − x₀ moves by −(α+σ)/σ·δ = −δ/σ: factor (√SNR + 1)².
        The loss weightings divide by it to weight every kind's loss as they weight the x₀ error.
        """
        if self is PredictionType.EPSILON:
            return snr
        if self is PredictionType.V:
            return snr + 1.0
        return (snr.sqrt() + 1.0) ** 2


@dataclass
class Prediction:
    """A denoiser's output plus what else the loss needs from it.

    `output` is what the configured losses compare with the schedule's target ([B, C, h, w] like the latents).
    `variance`: the learned-variance channels of a model that predicts its own variance (the second half of its output
    channels), in [-1, 1]; the trainer adds the schedule's variational bound on them at `vb_loss_strength`, logged as
    `loss/vb`.
    `losses` are other per-sample terms ([B], already scaled by the family's own strength setting); the trainer adds
    them to the loss and logs each as `loss/<name>`.
    """

    output: torch.Tensor
    losses: dict[str, torch.Tensor] = field(default_factory=dict)
    variance: torch.Tensor | None = None
