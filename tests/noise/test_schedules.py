"""The noise schedules: the continuous cosine maths, the discrete one against diffusers, the prediction kinds."""

from __future__ import annotations

import math

import pytest
import torch

from onetrainer.config.enums import LossWeight, NoiseScheduler, TimestepDistribution
from onetrainer.families.wuerstchen import wuerstchen_remap
from onetrainer.noise.cosine import TIMESTEP_BINS, ContinuousCosineSchedule
from onetrainer.noise.discrete import DiscreteSchedule
from onetrainer.noise.prediction import PredictionType
from onetrainer.noise.weighting import timestep_weights
from tests.helpers import timestep_settings

SD_BETAS = {"beta_schedule": "scaled_linear", "beta_start": 0.00085, "beta_end": 0.012}


def cosine_alpha_bar(t: float, s: float = 0.008) -> float:
    value = math.cos((t + s) / (1 + s) * math.pi / 2) ** 2 / math.cos(s / (1 + s) * math.pi / 2) ** 2
    return min(max(value, 1e-4), 0.9999)


def test_cosine_alpha_bar_follows_the_formula_and_is_clamped():
    schedule = ContinuousCosineSchedule()
    t = torch.tensor([0.0, 0.001, 0.25, 0.5, 0.75, 0.999, 1.0])
    expected = torch.tensor([cosine_alpha_bar(float(x)) for x in t])
    assert torch.allclose(schedule.alpha_bar(t), expected, atol=1e-6)
    assert schedule.alpha_bar(torch.tensor([0.0])).item() == pytest.approx(0.9999)  # clamped at the top
    assert schedule.alpha_bar(torch.tensor([1.0])).item() == pytest.approx(1e-4)  # and at the bottom
    assert schedule.snr(torch.tensor([0.5])).item() == pytest.approx(
        cosine_alpha_bar(0.5) / (1 - cosine_alpha_bar(0.5))
    )


def test_continuous_noise_and_target():
    schedule = ContinuousCosineSchedule(wuerstchen_remap)
    latents, noise = torch.randn(2, 16, 3, 3), torch.randn(2, 16, 3, 3)
    t = torch.tensor([0.1, 0.9])
    a = torch.tensor([cosine_alpha_bar(0.1), cosine_alpha_bar(0.9)]).view(-1, 1, 1, 1)
    assert torch.allclose(schedule.add_noise(latents, noise, t), a.sqrt() * latents + (1 - a).sqrt() * noise, atol=1e-6)
    assert schedule.target(latents, noise, t) is noise
    v = ContinuousCosineSchedule(prediction=PredictionType.V)
    assert torch.allclose(v.target(latents, noise, t), a.sqrt() * noise - (1 - a).sqrt() * latents, atol=1e-6)


def test_continuous_times_are_binned_remapped_and_respect_the_noising_range():
    schedule = ContinuousCosineSchedule(wuerstchen_remap)
    settings = timestep_settings(min_noising_strength=0.2, max_noising_strength=0.5)
    t = schedule.sample_times(20000, torch.Generator().manual_seed(0), settings, "cpu")
    assert t.dtype == torch.float32
    raw = (t - 0.001) / 1.08  # undo the remap: the draws lie on the 10000 bins inside [0.2, 0.5)
    bins = raw * TIMESTEP_BINS
    assert torch.allclose(bins, bins.round(), atol=1e-2)
    assert raw.min().item() >= 0.2 and raw.max().item() <= 0.5 + 1e-6 and raw.max().item() > 0.49
    assert schedule.model_time(t) is t  # the model takes the remapped t as its ratio input
    fractions = torch.tensor([0.0, 0.5, 1.0])
    assert schedule.validation_times(fractions, "cpu").tolist() == pytest.approx([0.001, 1.08 * 0.5 + 0.001, 1.0])


@pytest.mark.parametrize("kind", list(TimestepDistribution))
def test_every_distribution_works_on_both_schedules(kind):
    settings = timestep_settings(timestep_distribution=kind, noising_weight=1.0, noising_bias=0.5, timestep_shift=2.0)
    continuous = ContinuousCosineSchedule(wuerstchen_remap).sample_times(
        500, torch.Generator().manual_seed(1), settings, "cpu"
    )
    assert continuous.min().item() >= 0.001 and continuous.max().item() <= 1.0
    discrete = DiscreteSchedule({}, PredictionType.EPSILON).sample_times(
        500, torch.Generator().manual_seed(1), settings, "cpu"
    )
    assert discrete.dtype == torch.long and discrete.min().item() >= 0 and discrete.max().item() < 1000
    # The same draw, in the two time scales: the discrete step is the continuous bin k / 10 (t = (k + 1) / 10000).
    plain = ContinuousCosineSchedule().sample_times(500, torch.Generator().manual_seed(1), settings, "cpu")
    assert torch.equal(((plain * TIMESTEP_BINS).round().long() - 1) // 10, discrete)


@pytest.mark.parametrize("fn", [LossWeight.MIN_SNR_GAMMA, LossWeight.DEBIASED_ESTIMATION, LossWeight.P2])
def test_loss_weightings_work_on_the_continuous_schedule(fn):
    schedule = ContinuousCosineSchedule(wuerstchen_remap)
    t = torch.tensor([0.05, 0.5, 0.95])
    weights = timestep_weights(fn, 1.0, schedule, t)
    snr = schedule.snr(t)
    assert torch.isfinite(weights).all() and (weights > 0).all()
    if fn is LossWeight.P2:
        assert torch.allclose(weights, 1 / (1 + snr))  # the Würstchen / Cascade presets' weighting


def test_discrete_schedule_matches_diffusers_ddpm():
    from diffusers import DDPMScheduler

    betas = {"beta_schedule": "scaled_linear", "beta_start": 0.00085, "beta_end": 0.012}
    ddpm = DDPMScheduler(**betas, prediction_type="v_prediction", rescale_betas_zero_snr=True)
    ours = DiscreteSchedule(betas, PredictionType.V, zero_terminal_snr=True)
    latents, noise, t = torch.randn(3, 4, 5, 5), torch.randn(3, 4, 5, 5), torch.tensor([0, 500, 999])
    assert torch.equal(ours.add_noise(latents, noise, t), ddpm.add_noise(latents, noise, t))
    assert torch.equal(ours.target(latents, noise, t), ddpm.get_velocity(latents, noise, t))
    fractions = torch.tensor([0.0, 0.125, 0.5, 0.875, 1.0])
    assert ours.validation_times(fractions, "cpu").tolist() == [0, 124, 499, 874, 999]
    assert ours.sampler(NoiseScheduler.DDIM).config["prediction_type"] == "v_prediction"


def test_v_prediction_target_is_the_velocity():
    from diffusers import DDPMScheduler

    scheduler = DDPMScheduler(beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012)
    latents, noise = torch.randn(2, 4, 4, 4), torch.randn(2, 4, 4, 4)
    t = torch.tensor([10, 900])
    a = scheduler.alphas_cumprod[t].view(-1, 1, 1, 1)
    expected = a.sqrt() * noise - (1 - a).sqrt() * latents
    v_schedule = DiscreteSchedule(SD_BETAS, PredictionType.V)
    assert torch.allclose(v_schedule.target(latents, noise, t), expected, atol=1e-6)
    assert DiscreteSchedule(SD_BETAS, PredictionType.EPSILON).target(latents, noise, t) is noise


def test_the_discrete_schedule_noises_in_the_latents_dtype():
    # ᾱ indexed in the latents' dtype before the square roots, as diffusers' DDPM: the golden runs depend on it.
    from diffusers import DDPMScheduler

    ddpm = DDPMScheduler(**SD_BETAS)
    ours = DiscreteSchedule(SD_BETAS, PredictionType.EPSILON)
    latents, noise, t = torch.randn(2, 4, 3, 3).half(), torch.randn(2, 4, 3, 3).half(), torch.tensor([3, 700])
    assert torch.equal(ours.add_noise(latents, noise, t), ddpm.add_noise(latents, noise, t))


def test_flow_prediction_and_the_variational_bound_need_their_schedules():
    with pytest.raises(ValueError, match="epsilon or v"):
        DiscreteSchedule(SD_BETAS, PredictionType.FLOW)
    x = torch.zeros(1, 4, 2, 2)
    with pytest.raises(NotImplementedError, match="discrete β table"):
        ContinuousCosineSchedule().variational_bound(x, x, x, x, torch.tensor([0.5]))
