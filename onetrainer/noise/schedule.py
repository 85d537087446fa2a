"""The interface of a noise schedule: when the training time is drawn, how noise is added, what the model learns to
predict, the signal-to-noise ratio the loss weightings use, the variational bound where there is a β table, and which
sampler renders with it.

A schedule is written through its signal and noise scales (α_t, σ_t): x_t = α·x₀ + σ·ε, SNR = α²/σ², and the target
of each prediction kind (ε; v = α·ε − σ·x₀; flow = ε − x₀). The trainer and the loss code only call these methods;
nothing outside `noise/` reads a diffusers scheduler's fields. The kinds so far:

- `VariancePreservingSchedule`: α = √ᾱ, σ = √(1−ᾱ), from ᾱ(t);
  - `discrete.DiscreteSchedule`: DDPM betas over integer steps 0…T-1 (a diffusers scheduler config's table);
  - `cosine.ContinuousCosineSchedule`: the improved-DDPM cosine over t in (0, 1], remapped by the family.
- `flow_matching.FlowMatchingSchedule`: rectified flow over σ in (0, 1], α = 1 − σ, flow-velocity prediction, from a
  diffusers flow-matching scheduler config; its `sample_times` shifts σ statically or by the batch's latents'
  resolution (their token count), its `model_time` is σ·T.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from onetrainer.noise.prediction import PredictionType

if TYPE_CHECKING:
    from onetrainer.noise.timesteps import TimestepSettings


class NoiseSchedule(ABC):
    """The training noise process of a loaded model. Times are the schedule's own values: integer timesteps for a
    discrete schedule, floats in (0, 1] for a continuous one."""

    prediction: PredictionType
    zero_terminal_snr: bool = False  # the betas are rescaled so the last step is pure noise (samplers follow)

    @abstractmethod
    def scales(self, times: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(α_t, σ_t) per time, float32 on the times' device: x_t = α·x₀ + σ·ε."""

    @abstractmethod
    def sample_times(
        self,
        count: int,
        generator: torch.Generator,
        settings: TimestepSettings,
        device,
        latent_shape: Sequence[int] | None = None,
    ) -> torch.Tensor:
        """`count` training times drawn from the configured distribution (`settings`, built once per run).

        `latent_shape` is the batch's latents' shape [B, C, h, w] (B may be this process's share of `count`), for a
        schedule whose times depend on the resolution (a flow shift by h·w); the others ignore it.
        """

    @abstractmethod
    def validation_times(self, fractions: torch.Tensor, device) -> torch.Tensor:
        """The fixed times validation losses are measured at: `fractions` of the way along the schedule, from the
        clean end (0) to pure noise (1), in this schedule's time values."""

    @abstractmethod
    def sampler(self, kind, zero_terminal_snr: bool = False) -> Any:
        """A diffusers sampling scheduler of `kind` (a `NoiseScheduler` choice) set up for this schedule."""

    def model_time(self, times: torch.Tensor) -> torch.Tensor:
        """The time input the denoiser takes for these times."""
        return times

    @property
    def v_prediction(self) -> bool:
        return self.prediction is PredictionType.V

    def _coefficients(self, times: torch.Tensor, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(α, σ) in the dtype and on the device of `like`, shaped to broadcast over its non-batch dimensions."""
        alpha, sigma = self.scales(times.to(like.device))
        shape = (-1,) + (1,) * (like.dim() - 1)
        return alpha.to(like.dtype).reshape(shape), sigma.to(like.dtype).reshape(shape)

    def add_noise(self, latents: torch.Tensor, noise: torch.Tensor, times: torch.Tensor) -> torch.Tensor:
        """x_t = α·x₀ + σ·ε."""
        alpha, sigma = self._coefficients(times, latents)
        return alpha * latents + sigma * noise

    def target(self, latents: torch.Tensor, noise: torch.Tensor, times: torch.Tensor) -> torch.Tensor:
        """What the model learns to predict: ε, v = α·ε − σ·x₀, or the flow velocity ε − x₀."""
        if self.prediction is PredictionType.EPSILON:
            return noise
        if self.prediction is PredictionType.FLOW:
            return noise - latents
        alpha, sigma = self._coefficients(times, latents)
        return alpha * noise - sigma * latents

    def snr(self, times: torch.Tensor) -> torch.Tensor:
        """α²/σ² per time (float32), for the loss weightings (min-SNR-γ, P2, debiased estimation)."""
        alpha, sigma = self.scales(times)
        return alpha.float() ** 2 / sigma.float() ** 2

    def variational_bound(
        self,
        predicted_noise: torch.Tensor,
        variance: torch.Tensor,
        latents: torch.Tensor,
        noisy_latents: torch.Tensor,
        times: torch.Tensor,
    ) -> torch.Tensor:
        """IDDPM's variational bound on learned-variance channels, per sample ([B], float32, in bits).

        Only a schedule with a discrete β table defines the reverse steps this bound is over."""
        raise NotImplementedError(
            f"{type(self).__name__} has no discrete β table: a learned-variance output (Prediction.variance, trained "
            "at vb_loss_strength) needs a discrete DDPM schedule"
        )


class VariancePreservingSchedule(NoiseSchedule):
    """α = √ᾱ, σ = √(1−ᾱ) (α² + σ² = 1), from ᾱ(t), the share of the signal's variance left at t."""

    @abstractmethod
    def alpha_bar(self, times: torch.Tensor) -> torch.Tensor:
        """ᾱ per time (float32, on the times' device)."""

    def scales(self, times: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a = self.alpha_bar(times).float()
        return a.sqrt(), (1.0 - a).sqrt()

    def _coefficients(self, times: torch.Tensor, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # ᾱ is cast to the latents' dtype before the square roots (as diffusers does): the noised latents and targets
        # stay bit-identical to the recorded golden runs.
        a = self.alpha_bar(times.to(like.device)).to(like.dtype)
        shape = (-1,) + (1,) * (like.dim() - 1)
        return (a**0.5).reshape(shape), ((1 - a) ** 0.5).reshape(shape)

    def snr(self, times: torch.Tensor) -> torch.Tensor:
        """ᾱ / (1 − ᾱ), computed from ᾱ directly (not through the rounded square roots)."""
        a = self.alpha_bar(times).float()
        return a / (1.0 - a)
