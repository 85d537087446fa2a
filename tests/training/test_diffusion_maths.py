"""The loss maths on small tensors: targets, masked loss, loss weighting."""

from __future__ import annotations

import pytest
import torch

from onetrainer.config import TrainConfig
from onetrainer.config.enums import LossWeight
from onetrainer.training import diffusion
from onetrainer.training.noise_schedules import DiscreteSchedule, PredictionType

SD_BETAS = {"beta_schedule": "scaled_linear", "beta_start": 0.00085, "beta_end": 0.012}


def schedule_with(alphas: torch.Tensor, prediction: PredictionType) -> DiscreteSchedule:
    """A discrete schedule with the given ᾱ table."""
    schedule = DiscreteSchedule(SD_BETAS, prediction)
    schedule.alphas_cumprod = alphas
    return schedule


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


def test_masked_loss_weights_and_normalisation():
    pixel_loss = torch.ones(2, 1, 2, 2) * torch.tensor([[[[1.0, 2.0], [3.0, 4.0]]]])
    masks = torch.tensor([[[[1.0, 0.0], [0.5, 0.0]]], [[[1.0, 1.0], [0.0, 0.0]]]])
    keep_unmasked = torch.tensor([False, True])
    weights = diffusion.mask_weights(masks, keep_unmasked, unmasked_weight=0.1)
    assert torch.allclose(weights[0], torch.tensor([[[1.0, 0.1], [0.5, 0.1]]]))  # w = max(m, 0.1)
    assert torch.all(weights[1] == 1.0)  # trained as if unmasked
    plain = diffusion.reduce_loss(pixel_loss, weights, normalize=False)
    assert plain[0].item() == pytest.approx((1 * 1 + 2 * 0.1 + 3 * 0.5 + 4 * 0.1) / 4)
    normalized = diffusion.reduce_loss(pixel_loss, weights, normalize=True)
    assert normalized[0].item() == pytest.approx(plain[0].item() / ((1 + 0.1 + 0.5 + 0.1) / 4))
    assert normalized[1].item() == pytest.approx(2.5)


def test_loss_functions_are_summed_with_their_strengths():
    config = TrainConfig(mse_strength=0.5, mae_strength=2.0, huber_strength=1.0, huber_delta=1.0, log_cosh_strength=1.0)
    pred, target = torch.tensor([[[[3.0]]]]), torch.tensor([[[[1.0]]]])
    diff = 2.0
    huber = 1.0 * (diff - 0.5)
    log_cosh = torch.log(torch.cosh(torch.tensor(diff))).item()
    expected = 0.5 * diff**2 + 2.0 * diff + huber + log_cosh
    assert diffusion.per_pixel_loss(pred, target, config).item() == pytest.approx(expected, rel=1e-5)


def test_timestep_weights():
    alphas = torch.tensor([0.9, 0.5, 0.1])
    t = torch.tensor([0, 1, 2])
    snr = alphas / (1 - alphas)
    gamma = 5.0
    eps, v = schedule_with(alphas, PredictionType.EPSILON), schedule_with(alphas, PredictionType.V)
    min_snr = diffusion.timestep_weights(LossWeight.MIN_SNR_GAMMA, gamma, eps, t)
    assert torch.allclose(min_snr, torch.minimum(snr, torch.tensor(gamma)) / snr)
    min_snr_v = diffusion.timestep_weights(LossWeight.MIN_SNR_GAMMA, gamma, v, t)
    assert torch.allclose(min_snr_v, torch.minimum(snr, torch.tensor(gamma)) / (snr + 1))
    debiased = diffusion.timestep_weights(LossWeight.DEBIASED_ESTIMATION, gamma, eps, t)
    assert torch.allclose(debiased, 1 / snr.sqrt())
    p2 = diffusion.timestep_weights(LossWeight.P2, 1.0, eps, t)
    assert torch.allclose(p2, 1 / (1 + snr))
    assert torch.all(diffusion.timestep_weights(LossWeight.CONSTANT, gamma, eps, t) == 1)


def test_timesteps_stay_within_the_noising_strength_range():
    config = TrainConfig(min_noising_strength=0.2, max_noising_strength=0.5)
    t = diffusion.sample_timesteps(10000, 1000, torch.Generator().manual_seed(0), config, "cpu")
    assert t.min().item() >= 200 and t.max().item() < 500 and t.max().item() > 480


def test_noise_is_reproducible_and_offset_noise_is_per_channel():
    config = TrainConfig(offset_noise_weight=0.0)
    latents = torch.zeros(2, 4, 8, 8)
    a = diffusion.sample_noise(latents, torch.Generator().manual_seed(1), config)
    b = diffusion.sample_noise(latents, torch.Generator().manual_seed(1), config)
    assert torch.equal(a, b)
    config.offset_noise_weight = 10.0
    offset = diffusion.sample_noise(latents, torch.Generator().manual_seed(1), config)
    per_channel_mean = (offset - a).mean(dim=(2, 3))
    assert per_channel_mean.abs().min() > 0.1  # a constant added per sample and channel
