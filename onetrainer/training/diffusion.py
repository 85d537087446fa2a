"""The diffusion maths shared by the families: noise, timesteps, targets, loss and its weighting.

Everything takes explicit tensors and generators, so the same inputs always give the same result (resume and
tests depend on it).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from onetrainer.config.enums import LossWeight


def sample_noise(latents: torch.Tensor, generator: torch.Generator, config) -> torch.Tensor:
    """Gaussian noise, plus offset noise (a per-sample, per-channel constant).

    Drawn on the CPU from `generator` (a CPU generator), so a run gives the same noise on every device.
    """
    noise = torch.randn(latents.shape, generator=generator, dtype=torch.float32)
    if config.offset_noise_weight > 0:
        offset = torch.randn((latents.shape[0], latents.shape[1], 1, 1), generator=generator, dtype=torch.float32)
        noise = noise + config.offset_noise_weight * offset
    return noise.to(latents.device, latents.dtype)


def perturb_noise(noise: torch.Tensor, generator: torch.Generator, config) -> torch.Tensor:
    """Input perturbation: the model sees slightly different noise than its target (arXiv 2301.11706)."""
    if config.perturbation_noise_weight <= 0:
        return noise
    extra = torch.randn(noise.shape, generator=generator, dtype=torch.float32).to(noise.device, noise.dtype)
    return noise + config.perturbation_noise_weight * extra


def sample_timesteps(batch: int, num_timesteps: int, generator: torch.Generator, config, device) -> torch.Tensor:
    """Integer timesteps in [min, max] noising strength x T, uniformly drawn."""
    low = round(config.min_noising_strength * (num_timesteps - 1))
    high = max(low + 1, round(config.max_noising_strength * num_timesteps))
    return torch.randint(low, high, (batch,), generator=generator, device="cpu").to(device)


def training_target(scheduler, latents: torch.Tensor, noise: torch.Tensor, timesteps: torch.Tensor, v_prediction: bool):
    """What the model learns to predict: the noise (epsilon) or the velocity (v-prediction)."""
    if v_prediction:
        return scheduler.get_velocity(latents, noise, timesteps)
    return noise


def per_pixel_loss(prediction: torch.Tensor, target: torch.Tensor, config) -> torch.Tensor:
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


def snr(alphas_cumprod: torch.Tensor, timesteps: torch.Tensor) -> torch.Tensor:
    a = alphas_cumprod.to(timesteps.device)[timesteps].float()
    return a / (1.0 - a)


def timestep_weights(fn: LossWeight, strength: float, alphas_cumprod, timesteps, v_prediction: bool) -> torch.Tensor:
    """Loss weight per sample by noise level (min-SNR-gamma, debiased estimation, P2)."""
    if fn is LossWeight.CONSTANT:
        return torch.ones(timesteps.shape, device=timesteps.device)
    s = snr(alphas_cumprod, timesteps)
    if fn is LossWeight.MIN_SNR_GAMMA:
        return torch.minimum(s, torch.full_like(s, strength)) / (s + 1.0 if v_prediction else s)
    if fn is LossWeight.DEBIASED_ESTIMATION:
        clipped = torch.clamp(s, max=1000.0)
        return 1.0 / torch.sqrt(clipped + 1.0 if v_prediction else clipped)
    if fn is LossWeight.P2:
        return (1.0 + (s + 1.0 if v_prediction else s)) ** (-strength)
    raise ValueError(f"loss weight {fn.value} does not apply to this model")
