"""The learned-variance VB term against a straightforward computation with torch.distributions."""

from __future__ import annotations

import math

import pytest
import torch
from torch.distributions import Normal, kl_divergence

from onetrainer.noise import variational_bound as vb
from onetrainer.noise.discrete import DiscreteSchedule
from onetrainer.noise.prediction import PredictionType

# PixArt's schedule: linear betas 0.0001–0.02 over 1000 steps.
BETAS = torch.linspace(1e-4, 0.02, 1000, dtype=torch.float64)
ALPHAS_CUMPROD = torch.cumprod(1.0 - BETAS, dim=0)
SHAPE = (4, 3, 3)


def _reference(eps, values, x_start, x_t, t: int) -> float:
    """One sample, written out from the definitions with python floats for the schedule."""
    beta = float(BETAS[t])
    ab = float(ALPHAS_CUMPROD[t])
    ab_prev = float(ALPHAS_CUMPROD[t - 1]) if t > 0 else 1.0
    # β̃_t, with t = 0 using β̃_1 (β̃_0 is 0).
    tt = max(t, 1)
    posterior_var = float(BETAS[tt]) * (1 - float(ALPHAS_CUMPROD[tt - 1])) / (1 - float(ALPHAS_CUMPROD[tt]))
    fraction = (values.double() + 1) / 2
    log_var = fraction * math.log(beta) + (1 - fraction) * math.log(posterior_var)
    std = torch.exp(0.5 * log_var)
    x0_hat = (x_t.double() - math.sqrt(1 - ab) * eps.double()) / math.sqrt(ab)

    def posterior_mean(x0):
        return (beta * math.sqrt(ab_prev) * x0 + (1 - ab_prev) * math.sqrt(1 - beta) * x_t.double()) / (1 - ab)

    model = Normal(posterior_mean(x0_hat), std)
    if t > 0:
        true = Normal(posterior_mean(x_start.double()), torch.full_like(std, math.sqrt(posterior_var)))
        nats = kl_divergence(true, model)
    else:
        x = x_start.double()
        upper = torch.where(x > 0.999, torch.ones_like(x), model.cdf(x + 1 / 255))
        lower = torch.where(x < -0.999, torch.zeros_like(x), model.cdf(x - 1 / 255))
        nats = -torch.log(upper - lower)
    return float(nats.mean()) / math.log(2)


def _batch(timesteps: list[int], seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    n = len(timesteps)
    x_start = torch.rand((n, *SHAPE), generator=generator) * 2 - 1
    x_start[:, 0, 0, 0] = 1.0  # the open-ended edge bins
    x_start[:, 0, 0, 1] = -1.0
    noise = torch.randn((n, *SHAPE), generator=generator)
    t = torch.tensor(timesteps)
    ab = ALPHAS_CUMPROD[t].float().reshape(-1, 1, 1, 1)
    x_t = ab.sqrt() * x_start + (1 - ab).sqrt() * noise
    # A prediction close to the truth, so the t = 0 decoder term is a likelihood of a sensible size.
    eps = noise + 0.05 * torch.randn((n, *SHAPE), generator=generator)
    values = torch.rand((n, *SHAPE), generator=generator) * 2 - 1
    return eps, values, x_start, x_t, t


@pytest.mark.parametrize("timesteps", [[0, 1, 5, 999], [0, 0, 300, 600]])
def test_matches_the_definitions(timesteps: list[int]) -> None:
    eps, values, x_start, x_t, t = _batch(timesteps)
    loss = vb.variational_bound(eps, values, x_start, x_t, t, ALPHAS_CUMPROD, BETAS)
    assert loss.shape == (len(timesteps),) and loss.dtype == torch.float32
    for i, step in enumerate(timesteps):
        expected = _reference(eps[i], values[i], x_start[i], x_t[i], step)
        assert loss[i].item() == pytest.approx(expected, rel=1e-4, abs=1e-6), step
    assert torch.isfinite(loss).all() and (loss >= 0).all()


def test_the_kl_vanishes_when_the_model_is_the_posterior() -> None:
    eps, _, x_start, x_t, t = _batch([10, 500])
    noise = (x_t - ALPHAS_CUMPROD[t].float().sqrt().reshape(-1, 1, 1, 1) * x_start) / (
        (1 - ALPHAS_CUMPROD[t].float()).sqrt().reshape(-1, 1, 1, 1)
    )
    at_posterior = -torch.ones_like(eps)  # v = -1: the posterior's own variance
    loss = vb.variational_bound(noise, at_posterior, x_start, x_t, t, ALPHAS_CUMPROD, BETAS)
    assert torch.allclose(loss, torch.zeros_like(loss), atol=1e-5)


def test_gradients_reach_only_the_variance_half() -> None:
    eps, values, x_start, x_t, t = _batch([0, 3, 400, 999])
    output = torch.cat([eps, values], dim=1).requires_grad_(True)
    predicted_noise, variance_values = vb.split_learned_variance(output)
    vb.variational_bound(predicted_noise, variance_values, x_start, x_t, t, ALPHAS_CUMPROD, BETAS).sum().backward()
    noise_grad, variance_grad = output.grad.chunk(2, dim=1)
    assert not noise_grad.any()
    assert variance_grad.abs().flatten(1).sum(dim=1).gt(0).all()  # every sample, t = 0 included


def test_posterior_log_variance_replaces_the_zero_at_t0() -> None:
    logs = vb.posterior_log_variance_clipped(ALPHAS_CUMPROD, BETAS)
    assert logs[0] == logs[1] and torch.isfinite(logs).all()
    assert logs[500].exp().item() == pytest.approx(
        float(BETAS[500] * (1 - ALPHAS_CUMPROD[499]) / (1 - ALPHAS_CUMPROD[500])), rel=1e-12
    )


def test_the_discrete_schedule_gives_the_bound_over_its_table() -> None:
    # PixArt's scheduler config: the schedule keeps only ᾱ (float32) and recovers β from it, as PixArt did before.
    schedule = DiscreteSchedule(
        {"beta_schedule": "linear", "beta_start": 1e-4, "beta_end": 0.02}, PredictionType.EPSILON
    )
    eps, values, x_start, x_t, t = _batch([0, 1, 5, 300, 999])
    ours = schedule.variational_bound(eps, values, x_start, x_t, t)
    table = schedule.alphas_cumprod
    betas = 1.0 - table / torch.cat([table.new_ones(1), table[:-1]])
    assert torch.equal(ours, vb.variational_bound(eps, values, x_start, x_t, t, table, betas))
    reference = vb.variational_bound(eps, values, x_start, x_t, t, ALPHAS_CUMPROD, BETAS)
    torch.testing.assert_close(ours, reference, rtol=1e-3, atol=1e-5)
