"""The continuous cosine schedule of Würstchen v2 and Stable Cascade (with the family's own remaps) against
diffusers' DDPMWuerstchenScheduler and the formulas written out here."""

from __future__ import annotations

import math

import pytest
import torch
from diffusers import DDPMWuerstchenScheduler

from onetrainer.families.wuerstchen import cascade_remap, wuerstchen_remap
from onetrainer.noise import cosine
from onetrainer.noise.cosine import ContinuousCosineSchedule


def test_alpha_bar_matches_diffusers_scheduler() -> None:
    scheduler = DDPMWuerstchenScheduler()
    t = torch.linspace(0, 1, 101)
    torch.testing.assert_close(
        ContinuousCosineSchedule().alpha_bar(t), scheduler._alpha_cumprod(t, torch.device("cpu"))
    )


def test_alpha_bar_formula_and_clamps() -> None:
    schedule = ContinuousCosineSchedule()
    t = torch.tensor([0.0, 0.3, 1.0])
    a0 = math.cos(0.008 / 1.008 * math.pi / 2) ** 2
    expected = [math.cos((0.3 + 0.008) / 1.008 * math.pi / 2) ** 2 / a0]
    assert schedule.alpha_bar(t)[0] == torch.tensor(0.9999)
    assert schedule.alpha_bar(t)[2] == torch.tensor(1e-4)
    torch.testing.assert_close(schedule.alpha_bar(t)[1:2], torch.tensor(expected))
    assert schedule.alpha_bar(t.half()).dtype == torch.float32
    assert torch.all(schedule.alpha_bar(torch.linspace(0, 1, 50)).diff() <= 0)


def test_the_families_remaps() -> None:
    t = torch.tensor([0.0, 0.5, 0.92, 1.0])
    torch.testing.assert_close(wuerstchen_remap(t), torch.tensor([0.001, 0.541, 0.9946, 1.0]))
    torch.testing.assert_close(cascade_remap(t), torch.tensor([0.001, 0.501, 0.921, 1.0]))
    validation = ContinuousCosineSchedule(cascade_remap).validation_times(torch.tensor([0.5, 0.5]), "cpu")
    torch.testing.assert_close(validation, torch.tensor([0.501, 0.501]))


def test_bins() -> None:
    unit = torch.tensor([0.0, 0.00005, 0.5, 0.99999, 1.0])
    bins = cosine.bins_from_unit(unit)
    assert bins.tolist() == [0, 0, 5000, 9999, 9999]
    torch.testing.assert_close(cosine.t_from_bins(bins), torch.tensor([1e-4, 1e-4, 0.5001, 1.0, 1.0]))


def test_noising_snr_and_x0_round_trip() -> None:
    schedule = ContinuousCosineSchedule(wuerstchen_remap)
    generator = torch.Generator().manual_seed(0)
    x0 = torch.randn(3, 16, 4, 4, generator=generator)
    noise = torch.randn(3, 16, 4, 4, generator=generator)
    t = torch.tensor([0.1, 0.5, 0.9])
    a = schedule.alpha_bar(t)
    x_t = schedule.add_noise(x0, noise, t)
    torch.testing.assert_close(x_t[1], a[1].sqrt() * x0[1] + (1 - a[1]).sqrt() * noise[1])
    # The clean latents an exact ε prediction implies: x0 = (x_t − √(1−ᾱ)·ε)/√ᾱ.
    shape = (-1, 1, 1, 1)
    recovered = (x_t - (1 - a).sqrt().view(shape) * noise) / a.sqrt().view(shape)
    torch.testing.assert_close(recovered, x0, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(schedule.snr(t), a / (1 - a))
    alpha, sigma = schedule.scales(t)
    torch.testing.assert_close(alpha, a.sqrt())
    torch.testing.assert_close(sigma, (1 - a).sqrt())
    # P2 with gamma 1 is (1 + SNR)^-1 = 1 - alpha_bar.
    torch.testing.assert_close(1 / (1 + schedule.snr(t)), 1 - a)


def test_diffusers_last_step_agrees_with_our_schedule() -> None:
    # The sampler's last step (t -> 0) with the true noise lands on ~x0: scheduler and training share one schedule.
    schedule = ContinuousCosineSchedule()
    scheduler = DDPMWuerstchenScheduler(s=0.008, scaler=1.0)  # what the families on this schedule sample with
    scheduler.set_timesteps(2)
    x0 = torch.randn(1, 16, 2, 2, generator=torch.Generator().manual_seed(1))
    noise = torch.randn(1, 16, 2, 2, generator=torch.Generator().manual_seed(2))
    t = scheduler.timesteps[1:2]
    x_t = schedule.add_noise(x0, noise, t)
    out = scheduler.step(noise, t, x_t).prev_sample
    a = schedule.alpha_bar(t) / schedule.alpha_bar(torch.zeros(1))
    expected = (x_t - (1 - a) * noise / (1 - schedule.alpha_bar(t)).sqrt()) / a.sqrt()
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(out, x0, rtol=0.02, atol=0.02)


def test_a_sampler_comes_from_the_familys_factory() -> None:
    with pytest.raises(NotImplementedError, match="sampler_factory"):
        ContinuousCosineSchedule().sampler(None)
    made = []
    schedule = ContinuousCosineSchedule(sampler_factory=lambda kind, ztsnr: made.append((kind, ztsnr)) or "sampler")
    assert schedule.sampler("DDIM", False) == "sampler" and made == [("DDIM", False)]
