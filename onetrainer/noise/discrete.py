"""DDPM betas over integer timesteps (from a diffusers scheduler config): ε or v, with the optional zero-terminal-SNR
rescale, and the variational bound over its β table for learned-variance models."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from onetrainer.noise import timesteps
from onetrainer.noise import variational_bound as vb
from onetrainer.noise.prediction import PredictionType
from onetrainer.noise.schedule import VariancePreservingSchedule

if TYPE_CHECKING:
    from onetrainer.noise.timesteps import TimestepSettings


class DiscreteSchedule(VariancePreservingSchedule):
    """DDPM betas over `num_train_timesteps` integer steps, from a diffusers scheduler config (its betas and their
    spacing); `zero_terminal_snr` rescales them so the last step is pure noise."""

    def __init__(self, scheduler_config: Mapping, prediction: PredictionType, zero_terminal_snr: bool = False) -> None:
        from diffusers import DDPMScheduler

        if prediction is PredictionType.FLOW:
            raise ValueError("a discrete DDPM schedule trains epsilon or v prediction, not a flow velocity")
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

    def sample_times(
        self,
        count: int,
        generator: torch.Generator,
        settings: TimestepSettings,
        device,
        latent_shape: Sequence[int] | None = None,
    ) -> torch.Tensor:
        return timesteps.sample_timesteps(count, self.num_train_timesteps, generator, settings, device)

    def validation_times(self, fractions: torch.Tensor, device) -> torch.Tensor:
        # Timestep t of N sits at (t + 1) / N: a half is t = N/2 − 1, as the validation time always was.
        times = (fractions.double() * self.num_train_timesteps).round().long() - 1
        return times.clamp(0, self.num_train_timesteps - 1).to(device)

    def sampler(self, kind, zero_terminal_snr: bool = False) -> Any:
        from onetrainer.sampling.schedulers import create_sampler

        return create_sampler(kind, self.scheduler_config, zero_terminal_snr)

    def betas(self) -> torch.Tensor:
        """β_t recovered from the ᾱ table (β_t = 1 − ᾱ_t/ᾱ_{t−1}), so it follows a zero-terminal-SNR rescale."""
        previous = torch.cat([self.alphas_cumprod.new_ones(1), self.alphas_cumprod[:-1]])
        return 1.0 - self.alphas_cumprod / previous

    def variational_bound(
        self,
        predicted_noise: torch.Tensor,
        variance: torch.Tensor,
        latents: torch.Tensor,
        noisy_latents: torch.Tensor,
        times: torch.Tensor,
    ) -> torch.Tensor:
        return vb.variational_bound(
            predicted_noise, variance, latents, noisy_latents, times, self.alphas_cumprod, self.betas()
        )
