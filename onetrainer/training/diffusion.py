"""The diffusion maths shared by the families: noise, the timestep distributions, the loss and its weighting (the
noise process itself, targets and SNR, is the family's `NoiseSchedule`, see `noise_schedules.py`).

Everything takes explicit tensors and generators, so the same inputs always give the same result (resume and
tests depend on it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from onetrainer.config.enums import LossWeight, TimestepDistribution

if TYPE_CHECKING:
    from onetrainer.config import TrainConfig
    from onetrainer.training.noise_schedules import NoiseSchedule


def sample_noise(latents: torch.Tensor, generator: torch.Generator, config: TrainConfig) -> torch.Tensor:
    """Gaussian noise, plus offset noise (a per-sample, per-channel constant).

    Drawn on the CPU from `generator` (a CPU generator), so a run gives the same noise on every device.
    """
    noise = torch.randn(latents.shape, generator=generator, dtype=torch.float32)
    if config.offset_noise_weight > 0:
        offset = torch.randn((latents.shape[0], latents.shape[1], 1, 1), generator=generator, dtype=torch.float32)
        noise = noise + config.offset_noise_weight * offset
    return noise.to(latents.device, latents.dtype)


def perturb_noise(noise: torch.Tensor, generator: torch.Generator, config: TrainConfig) -> torch.Tensor:
    """Input perturbation: the model sees slightly different noise than its target (arXiv 2301.11706)."""
    if config.perturbation_noise_weight <= 0:
        return noise
    extra = torch.randn(noise.shape, generator=generator, dtype=torch.float32).to(noise.device, noise.dtype)
    return noise + config.perturbation_noise_weight * extra


def sample_timesteps(
    batch: int, num_timesteps: int, generator: torch.Generator, config: TrainConfig, device
) -> torch.Tensor:
    """Integer timesteps: a draw from the configured distribution on [0, 1], shifted, then placed in
    [min, max] noising strength x T."""
    x = unit_timesteps(batch, config, generator)
    t = config.min_noising_strength + (config.max_noising_strength - config.min_noising_strength) * x
    return (t * num_timesteps).long().clamp(0, num_timesteps - 1).to(device)


_TABLE_SIZE = 1000


def unit_timesteps(count: int, config: TrainConfig, generator: torch.Generator) -> torch.Tensor:
    """`count` draws in [0, 1) from the timestep distribution (w = noising_weight, b = noising_bias), shifted."""
    kind, w, b = config.timestep_distribution, config.noising_weight, config.noising_bias
    if kind is TimestepDistribution.UNIFORM:
        x = torch.rand(count, generator=generator)
    elif kind is TimestepDistribution.LOGIT_NORMAL:
        x = torch.sigmoid(torch.randn(count, generator=generator) * (w + 1.0) + b)
    elif kind is TimestepDistribution.HEAVY_TAIL:
        # SD3's "mode" sampling: more weight in the middle or the ends depending on the scale w.
        u = torch.rand(count, generator=generator)
        x = 1.0 - u - w * (torch.cos(torch.pi / 2 * u) ** 2 - 1.0 + u)
    else:
        # Densities sampled from a table over [0, 1], with uniform jitter inside each cell.
        grid = (torch.arange(_TABLE_SIZE, dtype=torch.float64) + 0.5) / _TABLE_SIZE
        weights = timestep_density(kind, w, b, grid).clamp(min=0)
        if float(weights.sum()) <= 0:
            raise ValueError(f"the {kind.value} distribution with weight {w} and bias {b} has no mass in [0, 1]")
        cells = torch.multinomial(weights.float(), count, replacement=True, generator=generator)
        x = (cells.float() + torch.rand(count, generator=generator)) / _TABLE_SIZE
    x = x.clamp(0.0, 1.0 - 1e-6)
    return shift_timesteps(x, config.timestep_shift)


def timestep_density(kind: TimestepDistribution, w: float, b: float, x: torch.Tensor) -> torch.Tensor:
    """The (unnormalised) densities of the table-sampled distributions."""
    if kind is TimestepDistribution.COS_MAP:
        return 2.0 / (torch.pi - 2.0 * torch.pi * x + 2.0 * torch.pi * x**2)
    if kind is TimestepDistribution.SIGMOID:
        return torch.sigmoid(w * (x - (b + 0.5)))
    if kind is TimestepDistribution.INVERTED_PARABOLA:
        return torch.clamp(-w * (x - (b + 0.5)) ** 2 + 2.0, min=0.0)
    if kind is TimestepDistribution.BETA:
        alpha, beta = max(w, 1e-3), max(b, 1e-3)
        return x ** (alpha - 1.0) * (1.0 - x) ** (beta - 1.0)
    raise ValueError(f"{kind.value} is not a table distribution")


def shift_timesteps(x: torch.Tensor, shift: float) -> torch.Tensor:
    """t' = s t / ((s - 1) t + 1): s > 1 moves timesteps towards more noise, s < 1 towards less."""
    if shift == 1.0:
        return x
    return shift * x / ((shift - 1.0) * x + 1.0)


def timestep_histogram(
    config: TrainConfig, bins: int = 100, samples: int = 1_000_000, num_timesteps: int = 1000
) -> torch.Tensor:
    """How often each range of timesteps is drawn with these settings (for the GUI's preview): `bins` counts."""
    t = sample_timesteps(samples, num_timesteps, torch.Generator().manual_seed(0), config, "cpu")
    return torch.histc(t.float(), bins=bins, min=0, max=num_timesteps - 1)


def per_pixel_loss(prediction: torch.Tensor, target: torch.Tensor, config: TrainConfig) -> torch.Tensor:
    """The sum of the enabled loss functions, per element (not reduced)."""
    prediction = prediction.float()
    target = target.float()
    loss = torch.zeros_like(prediction)
    if config.mse_strength:
        loss = loss + config.mse_strength * F.mse_loss(prediction, target, reduction="none")
    if config.mae_strength:
        loss = loss + config.mae_strength * F.l1_loss(prediction, target, reduction="none")
    if config.huber_strength:
        loss = loss + config.huber_strength * F.huber_loss(
            prediction, target, reduction="none", delta=config.huber_delta
        )
    if config.log_cosh_strength:
        diff = prediction - target
        # log(cosh(x)) = |x| + log1p(exp(-2|x|)) - log(2), stable for large |x|.
        log_cosh = diff.abs() + torch.log1p(torch.exp(-2 * diff.abs())) - torch.log(torch.tensor(2.0))
        loss = loss + config.log_cosh_strength * log_cosh
    return loss


def mask_weights(masks: torch.Tensor, keep_unmasked: torch.Tensor, unmasked_weight: float) -> torch.Tensor:
    """Per-pixel loss weights w = max(m, unmasked_weight); samples drawn as unmasked train everywhere (m = 1)."""
    masks = torch.where(keep_unmasked.view(-1, 1, 1, 1), torch.ones_like(masks), masks)
    return masks.clamp(min=unmasked_weight, max=1.0)


def reduce_loss(pixel_loss: torch.Tensor, weights: torch.Tensor | None, normalize: bool) -> torch.Tensor:
    """Per-sample loss: the (weighted) mean over channels and pixels; optionally divided by the mean weight."""
    if weights is None:
        return pixel_loss.mean(dim=(1, 2, 3))
    weighted = (pixel_loss * weights).mean(dim=(1, 2, 3))
    if normalize:
        weighted = weighted / weights.mean(dim=(1, 2, 3)).clamp(min=1e-8)
    return weighted


def timestep_weights(fn: LossWeight, strength: float, schedule: NoiseSchedule, times: torch.Tensor) -> torch.Tensor:
    """Loss weight per sample by noise level (min-SNR-gamma, debiased estimation, P2), from the schedule's SNR at
    `times`; a v-prediction model's loss is an SNR + 1 weighted epsilon loss, which the weightings account for."""
    if fn is LossWeight.CONSTANT:
        return torch.ones(times.shape, device=times.device)
    s = schedule.snr(times)
    v_prediction = schedule.v_prediction
    if fn is LossWeight.MIN_SNR_GAMMA:
        return torch.minimum(s, torch.full_like(s, strength)) / (s + 1.0 if v_prediction else s)
    if fn is LossWeight.DEBIASED_ESTIMATION:
        clipped = torch.clamp(s, max=1000.0)
        return 1.0 / torch.sqrt(clipped + 1.0 if v_prediction else clipped)
    if fn is LossWeight.P2:
        return (1.0 + (s + 1.0 if v_prediction else s)) ** (-strength)
    raise ValueError(f"loss weight {fn.value} does not apply to this model")
