"""The loss maths on small tensors: masked loss, the loss functions, noise draws and the timestep range."""

from __future__ import annotations

import pytest
import torch

from onetrainer.config import TrainConfig
from onetrainer.noise.draws import DrawSettings, sample_noise
from onetrainer.noise.losses import LossSettings, latent_masks, mask_weights, per_pixel_loss, reduce_loss
from onetrainer.noise.timesteps import sample_timesteps
from onetrainer.training.settings import timestep_settings


def test_masked_loss_weights_and_normalisation():
    pixel_loss = torch.ones(2, 1, 2, 2) * torch.tensor([[[[1.0, 2.0], [3.0, 4.0]]]])
    masks = torch.tensor([[[[1.0, 0.0], [0.5, 0.0]]], [[[1.0, 1.0], [0.0, 0.0]]]])
    keep_unmasked = torch.tensor([False, True])
    weights = mask_weights(masks, keep_unmasked, unmasked_weight=0.1)
    assert torch.allclose(weights[0], torch.tensor([[[1.0, 0.1], [0.5, 0.1]]]))  # w = max(m, 0.1)
    assert torch.all(weights[1] == 1.0)  # trained as if unmasked
    plain = reduce_loss(pixel_loss, weights, normalize=False)
    assert plain[0].item() == pytest.approx((1 * 1 + 2 * 0.1 + 3 * 0.5 + 4 * 0.1) / 4)
    normalized = reduce_loss(pixel_loss, weights, normalize=True)
    assert normalized[0].item() == pytest.approx(plain[0].item() / ((1 + 0.1 + 0.5 + 0.1) / 4))
    assert normalized[1].item() == pytest.approx(2.5)


def test_loss_functions_are_summed_with_their_strengths():
    settings = LossSettings(
        mse_strength=0.5, mae_strength=2.0, huber_strength=1.0, huber_delta=1.0, log_cosh_strength=1.0
    )
    pred, target = torch.tensor([[[[3.0]]]]), torch.tensor([[[[1.0]]]])
    diff = 2.0
    huber = 1.0 * (diff - 0.5)
    log_cosh = torch.log(torch.cosh(torch.tensor(diff))).item()
    expected = 0.5 * diff**2 + 2.0 * diff + huber + log_cosh
    assert per_pixel_loss(pred, target, settings).item() == pytest.approx(expected, rel=1e-5)


def test_timesteps_stay_within_the_noising_strength_range():
    settings = timestep_settings(TrainConfig(min_noising_strength=0.2, max_noising_strength=0.5))
    t = sample_timesteps(10000, 1000, torch.Generator().manual_seed(0), settings, "cpu")
    assert t.min().item() >= 200 and t.max().item() < 500 and t.max().item() > 480


def test_noise_is_reproducible_and_offset_noise_is_per_channel():
    settings = DrawSettings(offset_noise_weight=0.0, perturbation_noise_weight=0.0)
    latents = torch.zeros(2, 4, 8, 8)
    a = sample_noise(latents, torch.Generator().manual_seed(1), settings)
    b = sample_noise(latents, torch.Generator().manual_seed(1), settings)
    assert torch.equal(a, b)
    settings = DrawSettings(offset_noise_weight=10.0, perturbation_noise_weight=0.0)
    offset = sample_noise(latents, torch.Generator().manual_seed(1), settings)
    per_channel_mean = (offset - a).mean(dim=(2, 3))
    assert per_channel_mean.abs().min() > 0.1  # a constant added per sample and channel


def test_a_clips_mask_weighs_every_latent_frame_and_per_frame_masks_average_by_area():
    """Video latents [B, C, f, h, w]: one mask per clip ([B, 1, H, W]) weighs all f frames alike; per-frame masks
    [B, 1, F, H, W] are averaged over the frames (and pixels) each latent cell holds; the loss is the mean over every
    non-batch dimension, the masked one normalised by the mask's own mean."""
    mask = torch.zeros(2, 1, 16, 16)
    mask[:, :, :, :8] = 1.0  # the left half trains
    small = latent_masks(mask, torch.Size([2, 4, 3, 2, 2]))
    assert small.shape == (2, 1, 1, 2, 2) and small[..., 0].eq(1).all() and small[..., 1].eq(0).all()
    assert latent_masks(mask, torch.Size([2, 4, 2, 2])).shape == (2, 1, 2, 2)  # an image's latents, as before
    per_frame = torch.zeros(1, 1, 4, 8, 8)
    per_frame[:, :, 2:] = 1.0
    assert latent_masks(per_frame, torch.Size([1, 4, 2, 1, 1])).flatten().tolist() == [0.0, 1.0]

    loss = torch.ones(2, 4, 3, 2, 2)
    loss[..., 1] = 3.0  # the masked-out half's error
    weights = mask_weights(small, torch.tensor([False, True]), 0.0)  # the second sample trains unmasked
    assert reduce_loss(loss, None, False).tolist() == [2.0, 2.0]
    assert reduce_loss(loss, weights, True).tolist() == [1.0, 2.0]
