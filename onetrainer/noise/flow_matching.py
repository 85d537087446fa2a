"""The flow-matching (rectified flow) noise schedule, with the resolution-dependent time shift.

Times are the noise level σ in (0, 1]: x_t = (1 − σ)·x₀ + σ·ε (α = 1 − σ), the model predicts the velocity ε − x₀
(`PredictionType.FLOW`) and SNR = ((1 − σ)/σ)². The schedule is built from the model's diffusers
`FlowMatchEulerDiscreteScheduler` config (`num_train_timesteps`, `shift`, `use_dynamic_shifting`, `base_shift`,
`max_shift`, `base_image_seq_len`, `max_image_seq_len`, `time_shift_type`; missing keys take diffusers' defaults)
and the number of latent pixels per token side (`patch_size`: 2 for a model that packs 2×2 latent patches into one
token, so a [B, C, h, w] latent is (h // 2)·(w // 2) tokens).

Training σ, as OneTrainer's flow-matching setups draw it (`_get_timestep_discrete` with a shift, then
`_add_noise_discrete`):

- a draw x of the configured `timestep_distribution` (`timesteps.unit_timesteps`), shifted by s:
  x' = s·x / (1 + (s − 1)·x). s is `timestep_shift`, or with `dynamic_timestep_shifting` the resolution shift
  instead (OneTrainer replaces the static shift with it; the two do not compose): e^μ, where
  μ = base_shift + (max_shift − base_shift)·(tokens − base_image_seq_len)/(max_image_seq_len − base_image_seq_len)
  (diffusers' `calculate_shift`, OneTrainer's `calculate_timestep_shift`; extrapolated beyond the two lengths, as
  both do) for the batch's latents' token count. This is the form diffusers' scheduler applies at sampling
  (`time_shift` with `time_shift_type="exponential"`: e^μ / (e^μ + 1/σ − 1)); a config with
  `time_shift_type="linear"` shifts by μ itself, as that scheduler does;
- placed in [`min_noising_strength`, `max_noising_strength`] (`timesteps.noising_range`; after the shift, as this
  trainer's other schedules, so the range holds. OneTrainer places its continuous draws first and shifts them
  afterwards, so a shifted draw may leave the range; the two agree at the default range 0–1);
- discretised after the shift to the T = `num_train_timesteps` training steps as OneTrainer does: step
  k = ⌊T·x⌋ in [0, T − 1] and σ = (k + 1)/T, so σ lies in [1/T, 1] and is never 0 (the SNR stays finite).

Validation uses σ = 0.5 (OneTrainer's deterministic step T/2 − 1, i.e. σ = (k + 1)/T = 0.5, unshifted).

`model_time(σ)` = σ·T, what diffusers' flow pipelines pass to the denoiser as `timestep` (a model that takes
σ itself divides by T). OneTrainer passes k/T = σ − 1/T there; this follows the pipelines instead.

Sampling uses the model's own scheduler config (its `shift`, or its dynamic shift by the image's μ, which the
pipelines compute from the same base/max values; `mu` gives it), for every sampler choice: OneTrainer's flow
samplers run the model's `FlowMatchEulerDiscreteScheduler` whatever the `noise_scheduler` choice, and do not
follow the training shift (the timestep distribution decides which noise levels train, not how the model is best
integrated).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from onetrainer.noise import timesteps
from onetrainer.noise.prediction import PredictionType
from onetrainer.noise.schedule import NoiseSchedule
from onetrainer.util.threads import library_attribute

if TYPE_CHECKING:
    from onetrainer.noise.timesteps import TimestepSettings

SCHEDULER_CLASS = "FlowMatchEulerDiscreteScheduler"


class FlowMatchingSchedule(NoiseSchedule):
    """Rectified flow over σ in (0, 1] (see the module's docstring for the semantics and their sources).

    `scheduler_config`: the model's diffusers `FlowMatchEulerDiscreteScheduler` config (a mapping, e.g.
    `pipeline.scheduler.config`); `patch_size`: latent pixels per token side (the resolution shift counts
    (h // patch_size)·(w // patch_size) tokens).
    """

    prediction = PredictionType.FLOW

    def __init__(self, scheduler_config: Mapping, *, patch_size: int) -> None:
        if patch_size < 1:
            raise ValueError(f"patch_size must be at least 1, not {patch_size}")
        # diffusers fills in its defaults for the keys a model's config leaves out (some omit the base/max values).
        scheduler = library_attribute("diffusers", SCHEDULER_CLASS).from_config(dict(scheduler_config))
        config = dict(scheduler.config)
        self.scheduler_config: dict = config  # for samplers and saved pipelines
        self.patch_size = patch_size
        self.num_train_timesteps: int = int(config["num_train_timesteps"])
        self.time_shift_type: str = config.get("time_shift_type", "exponential")

    # -- the process ---------------------------------------------------------------------------------------------

    def scales(self, times: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        sigma = times.float()
        return 1.0 - sigma, sigma

    def model_time(self, times: torch.Tensor) -> torch.Tensor:
        """σ·T (`num_train_timesteps`): the `timestep` diffusers' flow pipelines give the denoiser."""
        return times * self.num_train_timesteps

    # -- the resolution shift ------------------------------------------------------------------------------------

    def tokens(self, latent_height: int, latent_width: int) -> int:
        """How many tokens the denoiser sees for latents of this size."""
        return (latent_height // self.patch_size) * (latent_width // self.patch_size)

    def mu(self, latent_height: int, latent_width: int) -> float:
        """μ of the resolution shift for latents of this size ([…, h, w]): linear in the token count between
        (base_image_seq_len, base_shift) and (max_image_seq_len, max_shift), as diffusers' `calculate_shift`. What a
        pipeline that takes `mu` gets, and what the model's scheduler shifts by at sampling when it shifts
        dynamically."""
        c = self.scheduler_config
        values = (c.get("base_image_seq_len"), c.get("max_image_seq_len"), c.get("base_shift"), c.get("max_shift"))
        if any(v is None for v in values):
            raise ValueError(
                "the model's scheduler config has no base/max image sequence length or shift: the resolution-dependent "
                "(dynamic) timestep shift needs base_image_seq_len, max_image_seq_len, base_shift and max_shift"
            )
        base_len, max_len, base_shift, max_shift = (float(v) for v in values)
        slope = (max_shift - base_shift) / (max_len - base_len)
        return base_shift + slope * (self.tokens(latent_height, latent_width) - base_len)

    def resolution_shift(self, latent_height: int, latent_width: int) -> float:
        """The shift s (σ' = s·σ / (1 + (s − 1)·σ)) of the dynamic shift at this latent size: e^μ, or μ under a
        config's `time_shift_type="linear"` (as diffusers' scheduler's `time_shift`)."""
        mu = self.mu(latent_height, latent_width)
        return mu if self.time_shift_type == "linear" else math.exp(mu)

    def training_shift(self, settings: TimestepSettings, latent_shape: Sequence[int] | None) -> float:
        """The shift training draws with: the static shift (`timestep_shift`), or with the dynamic shift
        (`dynamic_timestep_shifting`) the resolution shift of these latents ([…, h, w]) in its place (OneTrainer: the
        dynamic shift replaces the static one)."""
        if not settings.dynamic_shift:
            return float(settings.shift)
        if latent_shape is None or len(latent_shape) < 2:
            raise ValueError("the dynamic timestep shift needs the latents' shape [..., h, w]")
        return self.resolution_shift(int(latent_shape[-2]), int(latent_shape[-1]))

    # -- times ---------------------------------------------------------------------------------------------------

    def sample_times(
        self,
        count: int,
        generator: torch.Generator,
        settings: TimestepSettings,
        device,
        latent_shape: Sequence[int] | None = None,
    ) -> torch.Tensor:
        """σ per sample in [1/T, 1] (float32): the configured distribution, shifted (statically or by the latents'
        resolution), placed in the noising-strength range and discretised to the T training steps, σ = (k + 1)/T.
        Drawn on the CPU from `generator`, then moved to `device`."""
        shift = self.training_shift(settings, latent_shape)
        steps = timesteps.sample_timesteps(count, self.num_train_timesteps, generator, settings, "cpu", shift)
        return ((steps + 1).float() / self.num_train_timesteps).to(device)

    def validation_times(self, fractions: torch.Tensor, device) -> torch.Tensor:
        # σ itself is the position along the schedule (the model's shift moves training's draws, not this scale).
        return fractions.float().clamp(0.0, 1.0).to(device)

    # -- sampling ------------------------------------------------------------------------------------------------

    def sampler(self, kind, zero_terminal_snr: bool = False) -> Any:
        """The model's `FlowMatchEulerDiscreteScheduler` (its own shift rule) for every sampler choice `kind`, as
        OneTrainer samples flow models; `zero_terminal_snr` changes nothing (σ = 1 is already pure noise).

        With a dynamic shift in the model's config, `set_timesteps` needs `mu`: diffusers' flow pipelines compute it
        from the latents' token count by the same rule as `mu`; a pipeline or loop that takes it gets `self.mu(h, w)`.
        """
        return library_attribute("diffusers", SCHEDULER_CLASS).from_config(self.scheduler_config)
