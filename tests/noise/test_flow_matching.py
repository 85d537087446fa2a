"""The flow-matching schedule: its noising and target, the training σ of every timestep distribution with the static
and the resolution-dependent shift (μ against diffusers' own `calculate_shift`), the sampler against diffusers'
`FlowMatchEulerDiscreteScheduler`, and the loss weightings at the ends of the schedule."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler
from diffusers.pipelines.flux.pipeline_flux import calculate_shift

from onetrainer.config.enums import LossWeight, NoiseScheduler, TimestepDistribution
from onetrainer.noise import timesteps
from onetrainer.noise.cosine import ContinuousCosineSchedule
from onetrainer.noise.flow_matching import FlowMatchingSchedule
from onetrainer.noise.prediction import PredictionType
from onetrainer.noise.timesteps import TimestepSettings
from onetrainer.noise.weighting import timestep_weights
from tests.helpers import timestep_settings

# A dynamically shifting model's scheduler config (2×2 latent patches per token).
DYNAMIC = {
    "_class_name": "FlowMatchEulerDiscreteScheduler",
    "num_train_timesteps": 1000,
    "shift": 3.0,
    "use_dynamic_shifting": True,
    "base_shift": 0.5,
    "max_shift": 1.15,
    "base_image_seq_len": 256,
    "max_image_seq_len": 4096,
}
# A statically shifting one, with only the keys such a config writes (the rest are diffusers' defaults).
STATIC = {"num_train_timesteps": 1000, "shift": 3.0}
T = 1000
COUNT = 50_000


def schedule(config=DYNAMIC, patch_size=2) -> FlowMatchingSchedule:
    return FlowMatchingSchedule(config, patch_size=patch_size)


def draw(settings: TimestepSettings, latent_shape=(4, 16, 64, 64), seed=0, count=COUNT, flow=None) -> torch.Tensor:
    return (flow or schedule()).sample_times(count, torch.Generator().manual_seed(seed), settings, "cpu", latent_shape)


def test_noise_target_snr_and_model_time_on_known_numbers():
    flow = schedule()
    assert flow.prediction is PredictionType.FLOW
    x0 = torch.tensor([2.0, 4.0]).view(2, 1, 1, 1)
    noise = torch.tensor([-1.0, 1.0]).view(2, 1, 1, 1)
    sigma = torch.tensor([0.25, 1.0])
    assert flow.add_noise(x0, noise, sigma).flatten().tolist() == [0.75 * 2 - 0.25, 1.0]  # 1 − σ, σ; σ = 1 pure noise
    assert flow.target(x0, noise, sigma).flatten().tolist() == [-3.0, -3.0]  # ε − x₀
    assert flow.snr(torch.tensor([0.25, 0.5, 1.0])).tolist() == [9.0, 1.0, 0.0]  # ((1 − σ)/σ)²
    half = flow.add_noise(x0.half(), noise.half(), sigma)
    assert half.dtype == torch.float16
    assert flow.model_time(torch.tensor([0.001, 0.5, 1.0])).tolist() == pytest.approx([1.0, 500.0, 1000.0])
    assert flow.validation_times(torch.tensor([0.125, 0.5, 0.875]), "cpu").tolist() == [0.125, 0.5, 0.875]


def on_the_training_grid(sigma: torch.Tensor) -> bool:
    steps = sigma * T
    return bool(torch.allclose(steps, steps.round(), atol=1e-3)) and sigma.min() >= 1 / T and sigma.max() <= 1.0


DISTRIBUTIONS = {
    # distribution, weight, bias: the expected centre (median for the logit-normal, mean otherwise)
    TimestepDistribution.UNIFORM: (0.0, 0.0, 0.5),
    TimestepDistribution.LOGIT_NORMAL: (0.0, 0.7, 1 / (1 + math.exp(-0.7))),
    TimestepDistribution.HEAVY_TAIL: (0.5, 0.0, 0.5),
    TimestepDistribution.COS_MAP: (0.0, 0.0, 0.5),
    TimestepDistribution.BETA: (2.0, 5.0, 2 / 7),
    TimestepDistribution.INVERTED_PARABOLA: (20.0, -0.2, 0.3),  # support 0.3 ± 0.32
    TimestepDistribution.SIGMOID: (10.0, 0.0, None),  # more noise: mean above 0.5
}


@pytest.mark.parametrize(("weight", "bias"), [(0.0, 0.0), (0.5, 0.0), (0.0, -0.3), (1.0, 0.4)])
def test_the_logit_normal_draw_is_the_sigmoid_of_a_scaled_and_moved_normal(weight, bias):
    settings = timestep_settings(timestep_distribution=TimestepDistribution.LOGIT_NORMAL, noising_weight=weight,
                                 noising_bias=bias, timestep_shift=1.0)  # fmt: skip
    drawn = timesteps.unit_timesteps(COUNT, settings, torch.Generator().manual_seed(3))
    normal = torch.randn(COUNT, generator=torch.Generator().manual_seed(3))
    assert torch.equal(drawn, torch.sigmoid(normal * (weight + 1.0) + bias).clamp(0.0, 1.0 - 1e-6))  # to the bit


@pytest.mark.parametrize("kind", list(TimestepDistribution))
def test_every_distribution_gives_sigma_on_the_training_steps_with_its_shape(kind):
    weight, bias, centre = DISTRIBUTIONS[kind]
    sigma = draw(timestep_settings(timestep_distribution=kind, noising_weight=weight, noising_bias=bias))
    assert sigma.dtype == torch.float32 and sigma.shape == (COUNT,)
    assert on_the_training_grid(sigma)  # σ = (k + 1)/T, never 0
    if kind is TimestepDistribution.LOGIT_NORMAL:
        assert sigma.median().item() == pytest.approx(centre, abs=0.01)
    elif centre is None:
        assert sigma.mean().item() > 0.6
    else:
        assert sigma.mean().item() == pytest.approx(centre, abs=0.01)
    # the noising-strength range bounds every distribution: steps ⌊T·x⌋ for x in [0.2, 0.6)
    ranged = draw(
        timestep_settings(
            timestep_distribution=kind,
            noising_weight=weight,
            noising_bias=bias,
            min_noising_strength=0.2,
            max_noising_strength=0.6,
            timestep_shift=3.0,
        )
    )
    assert on_the_training_grid(ranged)
    assert ranged.min().item() >= 0.201 - 1e-6 and ranged.max().item() <= 0.6 + 1e-6


def test_the_uniform_draws_reach_both_ends_of_the_schedule():
    sigma = draw(timestep_settings(), count=200_000)
    assert sigma.min().item() == pytest.approx(1 / T) and sigma.max().item() == 1.0


def test_static_shift_follows_the_formula_and_moves_towards_noise():
    plain, shifted = draw(timestep_settings(timestep_shift=1.0)), draw(timestep_settings(timestep_shift=3.0))
    # The same draws, shifted by s·x/(1 + (s − 1)·x) and then discretised: σ = (⌊T·x'⌋ + 1)/T.
    x = timesteps.unit_timesteps(COUNT, timestep_settings(), torch.Generator().manual_seed(0)).double()
    expected = (torch.floor(T * (3 * x / (1 + 2 * x))) + 1) / T
    assert (shifted.double() - expected).abs().max().item() < 1 / T + 1e-6  # at most a floor's rounding apart
    assert (shifted.double() - expected).abs().lt(1e-6).float().mean().item() > 0.999
    # E[3u/(1 + 2u)] for uniform u, plus the half step of the discretisation
    assert shifted.mean().item() == pytest.approx(1.5 - 0.75 * math.log(3) + 0.5 / T, abs=0.004)
    assert plain.mean().item() == pytest.approx(0.5, abs=0.004)
    assert draw(timestep_settings(timestep_shift=0.5)).mean().item() < 0.45


@pytest.mark.parametrize("latent_size", [(64, 64), (128, 128), (96, 80), (65, 33), (16, 16)])
def test_dynamic_shift_is_diffusers_calculate_shift_of_the_token_count(latent_size):
    h, w = latent_size
    flow = schedule()
    tokens = (h // 2) * (w // 2)
    assert flow.tokens(h, w) == tokens
    assert flow.mu(h, w) == pytest.approx(calculate_shift(tokens, 256, 4096, 0.5, 1.15), abs=1e-12)
    dynamic = timestep_settings(dynamic_timestep_shifting=True, timestep_shift=5.0)
    assert flow.training_shift(dynamic, (2, 16, h, w)) == pytest.approx(math.exp(flow.mu(h, w)))
    # the dynamic shift replaces the static one (OneTrainer): the same draws as that shift set statically
    static = timestep_settings(timestep_shift=math.exp(flow.mu(h, w)))
    assert torch.equal(draw(dynamic, (2, 16, h, w), count=2000), draw(static, None, count=2000))


def test_dynamic_shift_gives_more_noise_to_larger_latents():
    logit_normal = TimestepDistribution.LOGIT_NORMAL
    settings = timestep_settings(dynamic_timestep_shifting=True, timestep_distribution=logit_normal)
    means = [draw(settings, (1, 16, size, size)).mean().item() for size in (32, 64, 128, 192)]
    assert means == sorted(means) and means[-1] - means[0] > 0.1
    assert draw(settings, (1, 16, 64, 64)).mean().item() > draw(timestep_settings(), (1, 16, 64, 64)).mean().item()
    # a patch size of 1 counts four times the tokens of the same latents
    assert schedule(patch_size=1).mu(64, 64) == pytest.approx(calculate_shift(4096, 256, 4096, 0.5, 1.15))


def test_the_dynamic_shift_needs_the_latents_and_the_schedules_values():
    settings = timestep_settings(dynamic_timestep_shifting=True)
    with pytest.raises(ValueError, match="latents' shape"):
        schedule().sample_times(2, torch.Generator().manual_seed(0), settings, "cpu", None)
    missing = FlowMatchingSchedule({**DYNAMIC, "base_shift": None}, patch_size=2)
    with pytest.raises(ValueError, match="base_shift"):
        missing.sample_times(2, torch.Generator().manual_seed(0), settings, "cpu", (1, 16, 64, 64))
    static = timestep_settings()
    missing.sample_times(2, torch.Generator().manual_seed(0), static, "cpu", (1, 16, 64, 64))  # static: fine
    defaults = schedule(STATIC)  # a config without the base/max values takes diffusers' defaults
    assert defaults.mu(128, 128) == pytest.approx(calculate_shift(4096))
    with pytest.raises(ValueError, match="patch_size"):
        FlowMatchingSchedule(DYNAMIC, patch_size=0)


def test_the_draws_are_deterministic_and_come_from_the_generator():
    logit_normal = TimestepDistribution.LOGIT_NORMAL
    settings = timestep_settings(timestep_distribution=logit_normal, dynamic_timestep_shifting=True)
    first, again = draw(settings, seed=7, count=64), draw(settings, seed=7, count=64)
    assert torch.equal(first, again)
    assert not torch.equal(first, draw(settings, seed=8, count=64))
    generator = torch.Generator().manual_seed(7)
    flow = schedule()
    one = flow.sample_times(32, generator, settings, "cpu", (4, 16, 64, 64))
    two = flow.sample_times(32, generator, settings, "cpu", (4, 16, 64, 64))
    assert not torch.equal(one, two)  # the generator moves on


def diffusers_sigmas(config: dict, steps: int, mu: float | None) -> torch.Tensor:
    """What diffusers' flow pipelines set: sigmas linspace(1, 1/N, N), shifted by the scheduler's own rule."""
    reference = FlowMatchEulerDiscreteScheduler.from_config(config)
    reference.set_timesteps(sigmas=np.linspace(1.0, 1 / steps, steps), mu=mu)
    return reference.sigmas


@pytest.mark.parametrize("kind", list(NoiseScheduler))
def test_the_sampler_is_the_models_flow_euler_scheduler_for_every_choice(kind):
    sampler = schedule().sampler(kind, zero_terminal_snr=True)
    assert isinstance(sampler, FlowMatchEulerDiscreteScheduler)
    assert sampler.config.use_dynamic_shifting and sampler.config.max_shift == 1.15


@pytest.mark.parametrize("latent_size", [(128, 128), (64, 96)])
def test_the_samplers_sigmas_follow_the_dynamic_shift_of_training(latent_size):
    h, w = latent_size
    flow, steps = schedule(), 20
    sampler = flow.sampler(NoiseScheduler.EULER)
    sampler.set_timesteps(sigmas=np.linspace(1.0, 1 / steps, steps), mu=flow.mu(h, w))
    tokens = (h // 2) * (w // 2)
    torch.testing.assert_close(sampler.sigmas, diffusers_sigmas(DYNAMIC, steps, calculate_shift(tokens)))
    # the same shift as training's dynamic shift at this size
    unshifted = torch.linspace(1.0, 1 / steps, steps, dtype=torch.float64)
    shift = flow.training_shift(timestep_settings(dynamic_timestep_shifting=True), (1, 16, h, w))
    expected = timesteps.shift_timesteps(unshifted, shift).float()
    torch.testing.assert_close(sampler.sigmas[:-1], expected, rtol=1e-5, atol=1e-6)
    assert sampler.sigmas[-1].item() == 0.0


def test_a_static_models_sampler_shifts_by_its_shift_and_a_linear_one_by_mu():
    steps = 10
    static = schedule(STATIC).sampler(NoiseScheduler.DDIM)
    static.set_timesteps(sigmas=np.linspace(1.0, 1 / steps, steps))
    unshifted = torch.linspace(1.0, 1 / steps, steps, dtype=torch.float64)
    torch.testing.assert_close(static.sigmas[:-1], timesteps.shift_timesteps(unshifted, 3.0).float())
    linear_config = {**DYNAMIC, "time_shift_type": "linear", "base_shift": 1.5, "max_shift": 3.0}
    linear = schedule(linear_config)
    assert linear.resolution_shift(128, 128) == pytest.approx(linear.mu(128, 128)) == pytest.approx(3.0)
    sampler = linear.sampler(NoiseScheduler.EULER)
    sampler.set_timesteps(sigmas=np.linspace(1.0, 1 / steps, steps), mu=linear.mu(128, 128))
    torch.testing.assert_close(sampler.sigmas[:-1], timesteps.shift_timesteps(unshifted, 3.0).float())


def test_every_weighting_is_finite_at_the_ends_of_the_schedule():
    flow = schedule()
    sigma = torch.tensor([1 / T, 0.01, 0.5, 0.99, 1.0])
    gamma = 5.0
    weights = {fn: timestep_weights(fn, gamma, flow, sigma) for fn in LossWeight}
    for fn, w in weights.items():
        assert torch.isfinite(w).all() and (w >= 0).all(), fn
    close = {"rtol": 1e-5, "atol": 1e-9}
    snr = ((1 - sigma) / sigma) ** 2
    torch.testing.assert_close(weights[LossWeight.MIN_SNR_GAMMA], torch.clamp(snr, max=gamma) * sigma**2, **close)
    torch.testing.assert_close(weights[LossWeight.P2], (1 + 1 / sigma**2) ** -gamma, **close)
    clipped = torch.clamp(snr, max=1000.0)
    torch.testing.assert_close(weights[LossWeight.DEBIASED_ESTIMATION], 1 / (clipped.sqrt() + 1), **close)
    torch.testing.assert_close(weights[LossWeight.SIGMA], sigma)  # OneTrainer's flow weighting
    assert weights[LossWeight.MIN_SNR_GAMMA][-1].item() == 0.0  # pure noise: no x₀ information to weight
    with pytest.raises(ValueError, match="SIGMA"):
        timestep_weights(LossWeight.SIGMA, gamma, ContinuousCosineSchedule(), torch.tensor([0.5]))


def test_drawn_times_weight_finitely_and_the_variational_bound_stays_unsupported():
    flow = schedule()
    sigma = draw(timestep_settings(timestep_shift=0.05), count=4096)  # crowded at the clean end
    for fn in LossWeight:
        assert torch.isfinite(timestep_weights(fn, 1.0, flow, sigma)).all(), fn
    with pytest.raises(NotImplementedError, match="discrete"):
        flow.variational_bound(*(torch.zeros(1, 4, 2, 2),) * 4, torch.tensor([0.5]))
