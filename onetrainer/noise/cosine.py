"""The continuous cosine noise schedule (improved DDPM) over a time ratio.

t is a ratio in (0, 1] (the denoiser may take it as its time input):
ᾱ(t) = clamp(cos²((t + s)/(1 + s)·π/2) / cos²(s/(1 + s)·π/2), 1e-4, 0.9999) with s = 0.008, as diffusers'
cosine DDPM scheduler (scaler 1) and the original trainers compute it. Training draws one of 10000 bins from the
configured timestep distribution and remaps it per model (the family's remap) before noising.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from onetrainer.noise import timesteps
from onetrainer.noise.prediction import PredictionType
from onetrainer.noise.schedule import VariancePreservingSchedule

if TYPE_CHECKING:
    from onetrainer.noise.timesteps import TimestepSettings

S = 0.008
ALPHA_BAR_MIN = 1e-4
ALPHA_BAR_MAX = 0.9999
TIMESTEP_BINS = 10000
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


def identity_remap(t: torch.Tensor) -> torch.Tensor:
    return t


class ContinuousCosineSchedule(VariancePreservingSchedule):
    """ᾱ(t) of the cosine above for t in (0, 1].

    The training time is a draw of the configured distribution, placed in [min, max] noising strength, quantised to
    `TIMESTEP_BINS` bins (bin k is t = (k + 1)/10000, never 0) and then passed through the family's `remap`
    (e.g. clamp(1.08·t + 0.001, 0.001, 1)); the model gets the remapped t as its time input.
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
        return alpha_bar(times)

    def sample_times(
        self,
        count: int,
        generator: torch.Generator,
        settings: TimestepSettings,
        device,
        latent_shape: Sequence[int] | None = None,
    ) -> torch.Tensor:
        t = timesteps.noising_range(timesteps.unit_timesteps(count, settings, generator), settings)
        return self.remap(t_from_bins(bins_from_unit(t))).to(device)

    def validation_times(self, fractions: torch.Tensor, device) -> torch.Tensor:
        return self.remap(fractions.float().clamp(0.0, 1.0)).to(device)

    def sampler(self, kind, zero_terminal_snr: bool = False) -> Any:
        if self.sampler_factory is None:
            # A family on this schedule that renders through a sampler choice gives its factory; the others sample
            # with their own stages' schedulers and never ask.
            raise NotImplementedError("this model's family chooses its samplers itself (no sampler_factory given)")
        return self.sampler_factory(kind, zero_terminal_snr)
