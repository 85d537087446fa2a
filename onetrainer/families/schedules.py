"""The noise schedule of the families whose models ship a diffusers DDPM scheduler config (SD, SDXL, PixArt)."""

from __future__ import annotations

from onetrainer.noise.discrete import DiscreteSchedule
from onetrainer.noise.prediction import PredictionType


def discrete_schedule(scheduler_config: dict, v_prediction: bool, zero_terminal_snr: bool) -> DiscreteSchedule:
    """The model's DDPM betas, with the prediction type the run trains."""
    prediction = PredictionType.V if v_prediction else PredictionType.EPSILON
    return DiscreteSchedule(scheduler_config, prediction, zero_terminal_snr)
