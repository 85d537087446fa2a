"""The learned-variance term of models that predict their own variance (e.g. 4 noise + 4 variance channels).

This is IDDPM's variational bound (Nichol & Dhariwal, arXiv 2102.09672): the model's reverse step
p(x_{t-1} | x_t) is a Gaussian whose mean comes from the predicted noise and whose log variance interpolates between
the posterior's log β̃_t and log β_t by the variance channels v ∈ [-1, 1]: log σ² = (v+1)/2 · log β_t + (1−v)/2 ·
log β̃_t. The loss is KL(q(x_{t-1} | x_t, x_0) ‖ p(x_{t-1} | x_t)) in bits, and at t = 0 the negative log-likelihood
of x_0 under a Gaussian discretized into 255 bins over [-1, 1] (the decoder term). The noise prediction is detached:
only the variance channels learn from this term; the configured losses train the noise half.

Everything takes the schedule's `alphas_cumprod` and `betas` explicitly (`DiscreteSchedule.variational_bound` passes
its table); the trainer applies the loss strength.
"""

from __future__ import annotations

import math

import torch

# IDDPM's decoder bins: 255 steps between -1 and 1, so ±1/255 around a value.
BIN_HALF_WIDTH = 1.0 / 255.0
_EDGE = 0.999
_TINY = 1e-12


def split_learned_variance(model_output: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(predicted noise, variance values): the first and second half of the channels (dim 1)."""
    return model_output.chunk(2, dim=1)


def posterior_log_variance_clipped(alphas_cumprod: torch.Tensor, betas: torch.Tensor) -> torch.Tensor:
    """log β̃_t per timestep, with β̃_0 (which is 0) replaced by β̃_1, as in IDDPM."""
    alphas_cumprod, betas = alphas_cumprod.double(), betas.double()
    previous = torch.cat([alphas_cumprod.new_ones(1), alphas_cumprod[:-1]])
    variance = betas * (1.0 - previous) / (1.0 - alphas_cumprod)
    return torch.log(torch.cat([variance[1:2], variance[1:]]))


def variational_bound(
    predicted_noise: torch.Tensor,
    variance_values: torch.Tensor,
    x_start: torch.Tensor,
    x_t: torch.Tensor,
    timesteps: torch.Tensor,
    alphas_cumprod: torch.Tensor,
    betas: torch.Tensor,
) -> torch.Tensor:
    """The VB term per sample, in bits (mean over every non-batch dimension), as float32.

    `timesteps` are integer indices into the schedule; `x_t = √ᾱ_t x_start + √(1−ᾱ_t) ε`.
    """
    device = x_t.device
    t = timesteps.to(device=device, dtype=torch.long)
    shape = (-1,) + (1,) * (x_t.dim() - 1)

    def at_t(values: torch.Tensor) -> torch.Tensor:
        return values.to(device)[t].float().reshape(shape)

    ab = alphas_cumprod.double()
    ab_prev = torch.cat([ab.new_ones(1), ab[:-1]])
    b = betas.double()
    mean_coef_start = at_t(b * ab_prev.sqrt() / (1.0 - ab))
    mean_coef_t = at_t((1.0 - ab_prev) * (1.0 - b).sqrt() / (1.0 - ab))
    min_log = at_t(posterior_log_variance_clipped(alphas_cumprod, betas))
    max_log = at_t(b.log())
    recip_sqrt_ab = at_t((1.0 / ab).sqrt())
    recipm1_sqrt_ab = at_t((1.0 / ab - 1.0).sqrt())

    x_start, x_t = x_start.float(), x_t.float()
    eps = predicted_noise.detach().float()
    fraction = (variance_values.float() + 1.0) / 2.0
    model_log_variance = fraction * max_log + (1.0 - fraction) * min_log
    predicted_start = recip_sqrt_ab * x_t - recipm1_sqrt_ab * eps
    model_mean = mean_coef_start * predicted_start + mean_coef_t * x_t
    true_mean = mean_coef_start * x_start + mean_coef_t * x_t

    kl = normal_kl(true_mean, min_log, model_mean, model_log_variance)
    decoder_nll = -discretized_gaussian_log_likelihood(x_start, model_mean, 0.5 * model_log_variance)
    terms = torch.where(t.reshape(shape) == 0, decoder_nll, kl)
    return terms.flatten(1).mean(dim=1) / math.log(2.0)


def normal_kl(mean1: torch.Tensor, log_var1: torch.Tensor, mean2: torch.Tensor, log_var2: torch.Tensor) -> torch.Tensor:
    """KL(N(mean1, e^log_var1) ‖ N(mean2, e^log_var2)) elementwise, in nats."""
    return 0.5 * (
        -1.0 + log_var2 - log_var1 + torch.exp(log_var1 - log_var2) + (mean1 - mean2) ** 2 * torch.exp(-log_var2)
    )


def discretized_gaussian_log_likelihood(x: torch.Tensor, mean: torch.Tensor, log_scale: torch.Tensor) -> torch.Tensor:
    """log P(bin of x) under N(mean, e^(2·log_scale)), bins ±1/255 wide around x, the outer bins open-ended (x at the
    edges of [-1, 1]), elementwise in nats. The exact normal CDF: IDDPM's tanh approximation of it is off by up to
    ~1e-4 in probability, which matters for the narrow bins at t = 0."""
    centered = x - mean
    inv_std = torch.exp(-log_scale)
    cdf_plus = torch.special.ndtr(inv_std * (centered + BIN_HALF_WIDTH))
    cdf_min = torch.special.ndtr(inv_std * (centered - BIN_HALF_WIDTH))
    log_cdf_plus = torch.log(cdf_plus.clamp(min=_TINY))
    log_one_minus_cdf_min = torch.log((1.0 - cdf_min).clamp(min=_TINY))
    log_delta = torch.log((cdf_plus - cdf_min).clamp(min=_TINY))
    return torch.where(x < -_EDGE, log_cdf_plus, torch.where(x > _EDGE, log_one_minus_cdf_min, log_delta))
