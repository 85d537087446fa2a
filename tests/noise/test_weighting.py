"""The loss weightings by noise level, for every prediction kind: ε and v as OneTrainer computes them, and the flow
velocity through its x₀-error factor, measured here from the schedule's own noising and target."""

from __future__ import annotations

import pytest
import torch

from onetrainer.config.enums import LossWeight
from onetrainer.noise.cosine import ContinuousCosineSchedule
from onetrainer.noise.discrete import DiscreteSchedule
from onetrainer.noise.flow_matching import FlowMatchingSchedule
from onetrainer.noise.prediction import PredictionType
from onetrainer.noise.schedule import NoiseSchedule
from onetrainer.noise.weighting import timestep_weights

SD_BETAS = {"beta_schedule": "scaled_linear", "beta_start": 0.00085, "beta_end": 0.012}


def flow_schedule() -> FlowMatchingSchedule:
    """Rectified flow: α = 1 − σ, σ, flow-velocity prediction."""
    return FlowMatchingSchedule({"num_train_timesteps": 1000}, patch_size=2)


def schedule_with(alphas: torch.Tensor, prediction: PredictionType) -> DiscreteSchedule:
    """A discrete schedule with the given ᾱ table."""
    schedule = DiscreteSchedule(SD_BETAS, prediction)
    schedule.alphas_cumprod = alphas
    return schedule


def test_epsilon_and_v_weights_are_onetrainers():
    alphas = torch.tensor([0.9, 0.5, 0.1])
    t = torch.tensor([0, 1, 2])
    snr = alphas / (1 - alphas)
    gamma = 5.0
    eps, v = schedule_with(alphas, PredictionType.EPSILON), schedule_with(alphas, PredictionType.V)
    min_snr = timestep_weights(LossWeight.MIN_SNR_GAMMA, gamma, eps, t)
    assert torch.equal(min_snr, torch.minimum(snr, torch.tensor(gamma)) / snr)
    min_snr_v = timestep_weights(LossWeight.MIN_SNR_GAMMA, gamma, v, t)
    assert torch.equal(min_snr_v, torch.minimum(snr, torch.tensor(gamma)) / (snr + 1))
    debiased = timestep_weights(LossWeight.DEBIASED_ESTIMATION, gamma, eps, t)
    assert torch.equal(debiased, 1 / torch.sqrt(snr))
    debiased_v = timestep_weights(LossWeight.DEBIASED_ESTIMATION, gamma, v, t)
    assert torch.equal(debiased_v, 1 / torch.sqrt(snr + 1))
    p2 = timestep_weights(LossWeight.P2, 1.0, eps, t)
    assert torch.equal(p2, (1 + snr) ** -1.0)
    p2_v = timestep_weights(LossWeight.P2, 2.0, v, t)
    assert torch.equal(p2_v, (1 + (snr + 1)) ** -2.0)
    assert torch.all(timestep_weights(LossWeight.CONSTANT, gamma, eps, t) == 1)


def test_flow_schedule_noises_and_targets_through_its_scales():
    schedule = flow_schedule()
    x0, noise, t = torch.randn(2, 4, 3, 3), torch.randn(2, 4, 3, 3), torch.tensor([0.25, 0.8])
    shape = (-1, 1, 1, 1)
    torch.testing.assert_close(schedule.add_noise(x0, noise, t), (1 - t).view(shape) * x0 + t.view(shape) * noise)
    torch.testing.assert_close(schedule.target(x0, noise, t), noise - x0)
    torch.testing.assert_close(schedule.snr(t), ((1 - t) / t) ** 2)


def measured_x0_error_factor(schedule: NoiseSchedule, times: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(SNR, ‖Δtarget‖²/‖Δx₀‖²) per time, measured: x_t stays fixed while x₀ moves by δ (and ε with it)."""
    generator = torch.Generator().manual_seed(3)
    shape = (len(times), 4, 3, 3)
    x0, noise, delta = (torch.randn(shape, generator=generator, dtype=torch.float64) for _ in range(3))
    ones, zeros = torch.ones(shape, dtype=torch.float64), torch.zeros(shape, dtype=torch.float64)
    # α and σ read off the schedule's (linear) noising, not from its formulas.
    alpha = schedule.add_noise(ones, zeros, times)
    sigma = schedule.add_noise(zeros, ones, times)
    x_t = schedule.add_noise(x0, noise, times)
    moved_x0 = x0 + delta
    moved_noise = (x_t - alpha * moved_x0) / sigma
    change = schedule.target(moved_x0, moved_noise, times) - schedule.target(x0, noise, times)
    factor = change.pow(2).flatten(1).sum(1) / delta.pow(2).flatten(1).sum(1)
    snr = (alpha[:, 0, 0, 0] / sigma[:, 0, 0, 0]) ** 2
    return snr.float(), factor.float()


SCHEDULES = {
    "epsilon": ContinuousCosineSchedule(),
    "v": ContinuousCosineSchedule(prediction=PredictionType.V),
    "flow": flow_schedule(),
}


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_weightings_divide_out_the_measured_x0_error_factor(name):
    schedule = SCHEDULES[name]
    t = torch.tensor([0.05, 0.3, 0.5, 0.7, 0.95])
    snr, factor = measured_x0_error_factor(schedule, t)
    expected_factor = {"epsilon": snr, "v": snr + 1, "flow": (snr.sqrt() + 1) ** 2}[name]
    torch.testing.assert_close(factor, expected_factor, rtol=1e-4, atol=0)
    gamma = 5.0
    close = {"rtol": 1e-4, "atol": 0.0}
    min_snr = timestep_weights(LossWeight.MIN_SNR_GAMMA, gamma, schedule, t)
    torch.testing.assert_close(min_snr, torch.clamp(snr, max=gamma) / factor, **close)
    debiased = timestep_weights(LossWeight.DEBIASED_ESTIMATION, gamma, schedule, t)
    assert snr.max() < 1000  # below debiased estimation's clip: the factor applies as measured
    torch.testing.assert_close(debiased, 1 / factor.sqrt(), **close)
    p2 = timestep_weights(LossWeight.P2, 0.5, schedule, t)
    torch.testing.assert_close(p2, (1 + factor) ** -0.5, **close)
