"""What the trainer adds per step on Flux.1: `run_training` against a bare diffusers + peft loop doing the same maths.

Both train a LoRA (rank 4 on the attention and MLP layers, the family's `attn-mlp` preset) on the tiny FLUX.1-dev model
(`tiny:flux-dev`) at 64 px, batch 2, AdamW, gradient clipping, both text encoders frozen, σ drawn logit-normally (as
OneTrainer's Flux LoRA preset trains). The bare loop takes `FluxPipeline`'s components and caches in memory up front
what the diffusers Flux LoRA example caches: the VAE latents, shifted and scaled ((z − shift)·scale), and
`encode_prompt`'s CLIP pooled output and T5 hidden states (512 tokens). Each step then draws the noise and σ (a
logit-normal draw through diffusers' `compute_density_for_timestep_sampling`, shifted by `timestep_shift` and placed
on the T training steps as our schedule does: σ = (⌊T·u⌋ + 1)/T), mixes x_t = (1 − σ)·x0 + σ·ε, packs it 2x2 with
`FluxPipeline._pack_latents`, builds the image ids with `_prepare_latent_image_ids` and zero text ids, calls the
transformer with timestep σ and the fixed training guidance (`transformer.guidance_scale`), unpacks, and trains the
velocity ε − x0 with MSE. Timing as `overhead.py`; each step's process CPU time is taken as well.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from onetrainer.benchmark.family_overhead import (
    bare_pipeline_lora,
    batch_order,
    compare_with_bare,
    lora_config,
    optimizer_step,
)
from onetrainer.benchmark.memory import PeakMemory
from onetrainer.benchmark.overhead import (
    _BARE_LOOP_SETTINGS,
    BARE,
    Run,
    _beyond_the_bare_loop,
    _check_counts,
    _load_pixels,
    _training_images,
    step_durations,
)

RESOLUTION = 64
MODEL = "tiny:flux-dev"
T5_TOKENS = 512  # FLUX.1-dev's prompt length (what our family and the pipeline use for dev)

# What the bare loop implements beyond the shared LoRA settings; `flux_config` refuses a config that asks otherwise.
_FLUX_BARE_SETTINGS = {
    **_BARE_LOOP_SETTINGS,
    "timestep_distribution": "LOGIT_NORMAL",
    "dynamic_timestep_shifting": False,
    "text_encoder_2_sequence_length": T5_TOKENS,
    "text_encoder_2.train": False,
    "text_encoder_2.dropout_probability": 0.0,
}


def flux_config(workdir: Path, device: torch.device):
    config, images = lora_config(
        workdir,
        device,
        "Flux",
        {
            "model_type": "FLUX_DEV_1",
            "base_model_name": MODEL,
            "resolution": str(RESOLUTION),
            "layer_filter_preset": "attn-mlp",
            "text_encoder_2_sequence_length": T5_TOKENS,
            "timestep_distribution": "LOGIT_NORMAL",  # OneTrainer's Flux LoRA preset
            "transformer": {"gradient_checkpointing": False},
            "text_encoder_2": {"train": False},
        },
    )
    different = _beyond_the_bare_loop(config, _FLUX_BARE_SETTINGS)
    if different:
        raise ValueError(f"the bare Flux loop does not do what the benchmark config asks for: {', '.join(different)}")
    return config, images


def sample_sigmas(count: int, config, num_train_timesteps: int, device: torch.device) -> torch.Tensor:
    """σ per sample as the diffusers Flux example draws it (logit-normal, mean `noising_bias`, standard deviation
    `noising_weight` + 1, as our LOGIT_NORMAL), shifted by `timestep_shift` and placed on the T training steps as
    our flow-matching schedule places it (σ = (⌊T·u⌋ + 1)/T, never 0)."""
    from diffusers.training_utils import compute_density_for_timestep_sampling

    u = compute_density_for_timestep_sampling(
        "logit_normal", count, logit_mean=config.noising_bias, logit_std=config.noising_weight + 1.0
    ).clamp(0.0, 1.0 - 1e-6)
    shift = float(config.timestep_shift)
    u = shift * u / ((shift - 1.0) * u + 1.0)
    steps = (u * num_train_timesteps).long().clamp(0, num_train_timesteps - 1)
    return ((steps + 1).float() / num_train_timesteps).to(device)


def run_bare(config, images: Path, device: torch.device, steps: int, warmup: int) -> tuple[Run, int]:
    """The bare loop's run and how many parameters it trained."""
    from diffusers import FluxPipeline

    _check_counts(steps, warmup)
    with PeakMemory(device) as memory:
        pipe, transformer, params, optimizer = bare_pipeline_lora("FluxPipeline", config, device)
        vae = pipe.vae
        num_train_timesteps = int(pipe.scheduler.config.num_train_timesteps)
        guidance_scale = float(config.transformer.guidance_scale)
        vae_scale_factor = pipe.vae_scale_factor

        samples = _training_images(images)
        with torch.no_grad():
            latents_of = {}
            for path, _ in samples:
                z = vae.encode(_load_pixels(path, RESOLUTION)[None].to(device)).latent_dist.mode()[0]
                latents_of[path] = (z - vae.config.shift_factor) * vae.config.scaling_factor
            text_of = {}
            for caption in {c for _, c in samples}:
                hidden, pooled, _ = pipe.encode_prompt(caption, device=device, max_sequence_length=T5_TOKENS)
                text_of[caption] = (hidden[0], pooled[0])
        del pipe
        batches = batch_order(len(samples), config.batch_size)
        times: list[float] = []
        cpu_times: list[float] = []
        for _ in range(warmup + steps):
            batch = [samples[i] for i in next(batches)]
            latents = torch.stack([latents_of[p] for p, _ in batch])
            hidden = torch.stack([text_of[c][0] for _, c in batch])
            pooled = torch.stack([text_of[c][1] for _, c in batch])
            count, channels, height, width = latents.shape
            noise = torch.randn_like(latents)
            sigmas = sample_sigmas(count, config, num_train_timesteps, device)
            s = sigmas.view(-1, 1, 1, 1)
            noisy = (1.0 - s) * latents + s * noise
            packed = FluxPipeline._pack_latents(noisy, count, channels, height, width)
            image_ids = FluxPipeline._prepare_latent_image_ids(count, height // 2, width // 2, device, latents.dtype)
            text_ids = torch.zeros(hidden.shape[1], 3, device=device, dtype=latents.dtype)
            guidance = None
            if transformer.config.guidance_embeds:
                guidance = torch.full((count,), guidance_scale, device=device, dtype=latents.dtype)
            output = transformer(
                hidden_states=packed,
                timestep=sigmas,  # σ: the transformer multiplies by 1000 itself
                guidance=guidance,
                pooled_projections=pooled,
                encoder_hidden_states=hidden,
                txt_ids=text_ids,
                img_ids=image_ids,
                return_dict=False,
            )[0]
            predicted = FluxPipeline._unpack_latents(
                output, height * vae_scale_factor, width * vae_scale_factor, vae_scale_factor
            )
            loss = torch.nn.functional.mse_loss(predicted.float(), (noise - latents).float())
            optimizer_step(loss, params, optimizer, config.clip_grad_norm)
            times.append(time.perf_counter())
            cpu_times.append(time.process_time())
        trained = sum(p.numel() for p in params)
    cpu = step_durations(cpu_times, warmup, steps)
    return Run(BARE, step_durations(times, warmup, steps), memory.peak_bytes, cpu), trained


def compare_flux_overhead(steps: int = 10, warmup: int = 2, repeat: int = 3, progress=print) -> dict:
    """Median steps/s of ours and of the bare loop over alternating repetitions, their ratio (also from the steps'
    CPU time), and the trained parameter count, checked to be the same in both loops."""
    return compare_with_bare("flux", flux_config, run_bare, steps, warmup, repeat, progress, check_trained=True)
