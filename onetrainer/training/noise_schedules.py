"""The noise process a family trains on: when the training time is drawn, how noise is added, what the model learns
to predict, the signal-to-noise ratio the loss weightings use, and which sampler renders with it.

Two kinds cover the six families:

- `DiscreteSchedule`: DDPM betas over integer timesteps 0…T-1 (SD 1.5 / 2.x, SDXL, PixArt), epsilon or v, with the
  optional zero-terminal-SNR rescale;
- `ContinuousCosineSchedule`: t in (0, 1], ᾱ(t) from the improved-DDPM cosine (s = 0.008) clamped to [1e-4, 0.9999],
  with a per-family remap of t (Würstchen v2, Stable Cascade).

Both draw the training time from the configured timestep distribution (`diffusion.unit_timesteps`, shift and the
min/max noising strength), so every distribution setting works on both. The trainer and the loss code only call the
methods of `NoiseSchedule`; nothing outside this module reads a diffusers scheduler's fields.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

import torch

from onetrainer.training import cosine_schedule, diffusion

if TYPE_CHECKING:
    from onetrainer.config import TrainConfig


class PredictionType(Enum):
    """What the denoiser outputs (and so what it learns): the noise, or the velocity √ᾱ·ε − √(1−ᾱ)·x₀."""

    EPSILON = "epsilon"
    V = "v_prediction"


@dataclass
class Prediction:
    """A denoiser's output plus the family's own loss terms.

    `output` is what the configured losses compare with the schedule's target ([B, C, h, w] like the latents).
    `losses` are extra per-sample terms ([B], already scaled by the family's own strength setting, e.g. PixArt's
    variational bound); the trainer adds them to the loss and logs each as `loss/<name>`.
    """

    output: torch.Tensor
    losses: dict[str, torch.Tensor] = field(default_factory=dict)


class NoiseSchedule(ABC):
    """The training noise process of a loaded model. Times are the schedule's own values: integer timesteps for a
    discrete schedule, floats in (0, 1] for a continuous one."""

    prediction: PredictionType
    zero_terminal_snr: bool = False  # the betas are rescaled so the last step is pure noise (samplers follow)

    @abstractmethod
    def alpha_bar(self, times: torch.Tensor) -> torch.Tensor:
        """ᾱ per time (float32, on the times' device): the share of the signal's variance left at that time."""

    @abstractmethod
    def sample_times(self, count: int, generator: torch.Generator, config: TrainConfig, device) -> torch.Tensor:
        """`count` training times drawn from the configured distribution (`config`: the TrainConfig)."""

    @abstractmethod
    def validation_times(self, count: int, device) -> torch.Tensor:
        """The fixed time validation losses are measured at (the middle of the schedule)."""

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
        a = self.alpha_bar(times.to(like.device)).to(like.dtype)
        shape = (-1,) + (1,) * (like.dim() - 1)
        return (a**0.5).reshape(shape), ((1 - a) ** 0.5).reshape(shape)

    def add_noise(self, latents: torch.Tensor, noise: torch.Tensor, times: torch.Tensor) -> torch.Tensor:
        """x_t = √ᾱ·x₀ + √(1−ᾱ)·ε."""
        signal, sigma = self._coefficients(times, latents)
        return signal * latents + sigma * noise

    def target(self, latents: torch.Tensor, noise: torch.Tensor, times: torch.Tensor) -> torch.Tensor:
        """What the model learns to predict: ε, or v = √ᾱ·ε − √(1−ᾱ)·x₀."""
        if self.prediction is PredictionType.EPSILON:
            return noise
        signal, sigma = self._coefficients(times, latents)
        return signal * noise - sigma * latents

    def snr(self, times: torch.Tensor) -> torch.Tensor:
        """ᾱ / (1 − ᾱ) per time (float32), for the loss weightings (min-SNR-γ, P2, debiased estimation)."""
        a = self.alpha_bar(times).float()
        return a / (1.0 - a)


class DiscreteSchedule(NoiseSchedule):
    """DDPM betas over `num_train_timesteps` integer steps, from a diffusers scheduler config (its betas and their
    spacing); `zero_terminal_snr` rescales them so the last step is pure noise."""

    def __init__(self, scheduler_config: Mapping, prediction: PredictionType, zero_terminal_snr: bool = False) -> None:
        from diffusers import DDPMScheduler

        overrides: dict[str, Any] = {"prediction_type": prediction.value}
        if zero_terminal_snr:
            overrides["rescale_betas_zero_snr"] = True
        # diffusers computes the betas (linear, scaled linear, cosine) and the rescale; we keep only the table.
        ddpm = DDPMScheduler.from_config(dict(scheduler_config), **overrides)
        self.prediction = prediction
        self.zero_terminal_snr = zero_terminal_snr
        self.scheduler_config: dict = dict(ddpm.config)  # for samplers and saved pipelines
        self.num_train_timesteps: int = ddpm.config.num_train_timesteps
        self.alphas_cumprod: torch.Tensor = ddpm.alphas_cumprod.clone()

    def alpha_bar(self, times: torch.Tensor) -> torch.Tensor:
        return self.alphas_cumprod.to(times.device)[times]

    def _coefficients(self, times: torch.Tensor, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # ᾱ is indexed in the latents' dtype before the square roots, as diffusers' DDPM does (exact golden runs).
        a = self.alphas_cumprod.to(like.device, like.dtype)[times.to(like.device)]
        shape = (-1,) + (1,) * (like.dim() - 1)
        return (a**0.5).reshape(shape), ((1 - a) ** 0.5).reshape(shape)

    def sample_times(self, count: int, generator: torch.Generator, config: TrainConfig, device) -> torch.Tensor:
        return diffusion.sample_timesteps(count, self.num_train_timesteps, generator, config, device)

    def validation_times(self, count: int, device) -> torch.Tensor:
        return torch.full((count,), self.num_train_timesteps // 2 - 1, dtype=torch.long, device=device)

    def sampler(self, kind, zero_terminal_snr: bool = False) -> Any:
        from onetrainer.sampling.schedulers import create_sampler

        return create_sampler(kind, self.scheduler_config, zero_terminal_snr)


CONTINUOUS_BINS = cosine_schedule.TIMESTEP_BINS


def identity_remap(t: torch.Tensor) -> torch.Tensor:
    return t


class ContinuousCosineSchedule(NoiseSchedule):
    """ᾱ(t) = clamp(cos²((t+s)/(1+s)·π/2) / cos²(s/(1+s)·π/2), 1e-4, 0.9999) for t in (0, 1], s = 0.008 (the
    formulas live in `cosine_schedule.py`).

    The training time is a draw of the configured distribution, placed in [min, max] noising strength, quantised to
    `CONTINUOUS_BINS` bins (bin k is t = (k + 1)/10000, never 0) and then passed through the family's `remap`
    (Würstchen: clamp(1.08·t + 0.001, 0.001, 1)); the model gets the remapped t as its time input.
    `sampler_factory` builds the family's sampling scheduler.
    """

    def __init__(
        self,
        remap: Callable[[torch.Tensor], torch.Tensor] = identity_remap,
        prediction: PredictionType = PredictionType.EPSILON,
        sampler_factory: Callable[[Any, bool], Any] | None = None,
    ) -> None:
        self.remap = remap
        self.prediction = prediction
        self.sampler_factory = sampler_factory

    def alpha_bar(self, times: torch.Tensor) -> torch.Tensor:
        return cosine_schedule.alpha_bar(times)

    def sample_times(self, count: int, generator: torch.Generator, config: TrainConfig, device) -> torch.Tensor:
        x = diffusion.unit_timesteps(count, config, generator)
        t = config.min_noising_strength + (config.max_noising_strength - config.min_noising_strength) * x
        return self.remap(cosine_schedule.t_from_bins(cosine_schedule.bins_from_unit(t))).to(device)

    def validation_times(self, count: int, device) -> torch.Tensor:
        return self.remap(torch.full((count,), cosine_schedule.DETERMINISTIC_T)).to(device)

    def sampler(self, kind, zero_terminal_snr: bool = False) -> Any:
        if self.sampler_factory is not None:
            return self.sampler_factory(kind, zero_terminal_snr)
        from diffusers import DDPMWuerstchenScheduler

        return DDPMWuerstchenScheduler(s=cosine_schedule.S, scaler=1.0)
