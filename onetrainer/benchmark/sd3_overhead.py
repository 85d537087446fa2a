"""What the trainer adds per step on Stable Diffusion 3.5: `run_training` against a bare diffusers + peft loop doing the
same maths.

Both train a LoRA (rank 4 on the attention layers, the family's `attn-only` preset) on the tiny SD 3.5 Medium model
(`tiny:sd35-medium`: MMDiT-X, qk-norm) at 64 px, batch 2, AdamW, gradient clipping, the three text encoders frozen, σ
drawn logit-normally (as OneTrainer's SD3 presets train), shifted by `timestep_shift` as our schedule shifts it. The
bare loop takes `StableDiffusion3Pipeline`'s components and caches in memory up front what the diffusers SD3 LoRA
example caches: the VAE latents, shifted and scaled ((z − shift)·scale), and `encode_prompt`'s joined hidden states and
pooled outputs (T5's 256 tokens). Each step draws the noise and σ (`flux_overhead.sample_sigmas`), mixes
x_t = (1 − σ)·x0 + σ·ε, calls the transformer with timestep σ·1000, and trains the velocity ε − x0 with MSE.
Timing as `overhead.py`.
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
from onetrainer.benchmark.flux_overhead import sample_sigmas
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
MODEL = "tiny:sd35-medium"

# What the bare loop implements beyond the shared LoRA settings; `sd3_config` refuses a config that asks otherwise.
_SD3_BARE_SETTINGS = {
    **_BARE_LOOP_SETTINGS,
    "timestep_distribution": "LOGIT_NORMAL",
    "dynamic_timestep_shifting": False,
    "text_encoder_2.train": False,
    "text_encoder_2.dropout_probability": 0.0,
    "text_encoder_3.train": False,
    "text_encoder_3.dropout_probability": 0.0,
}


def sd3_config(workdir: Path, device: torch.device):
    config, images = lora_config(
        workdir,
        device,
        "SD 3.5",
        {
            "model_type": "STABLE_DIFFUSION_35",
            "base_model_name": MODEL,
            "resolution": str(RESOLUTION),
            "layer_filter_preset": "attn-only",
            "timestep_distribution": "LOGIT_NORMAL",  # OneTrainer's SD3 presets
            "transformer": {"gradient_checkpointing": False},
            "text_encoder_2": {"train": False},
            "text_encoder_3": {"train": False},
        },
    )
    different = _beyond_the_bare_loop(config, _SD3_BARE_SETTINGS)
    if different:
        raise ValueError(f"the bare SD 3 loop does not do what the benchmark config asks for: {', '.join(different)}")
    return config, images


def run_bare(config, images: Path, device: torch.device, steps: int, warmup: int) -> tuple[Run, int]:
    """The bare loop's run and how many parameters it trained."""
    _check_counts(steps, warmup)
    with PeakMemory(device) as memory:
        pipe, transformer, params, optimizer = bare_pipeline_lora("StableDiffusion3Pipeline", config, device)
        vae = pipe.vae
        num_train_timesteps = int(pipe.scheduler.config.num_train_timesteps)
        samples = _training_images(images)
        with torch.no_grad():
            latents_of = {}
            for path, _ in samples:
                z = vae.encode(_load_pixels(path, RESOLUTION)[None].to(device)).latent_dist.mode()[0]
                latents_of[path] = (z - vae.config.shift_factor) * vae.config.scaling_factor
            text_of = {}
            for caption in {c for _, c in samples}:
                hidden, _, pooled, _ = pipe.encode_prompt(
                    caption, caption, caption, device=device, do_classifier_free_guidance=False
                )
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
            noise = torch.randn_like(latents)
            sigmas = sample_sigmas(len(latents), config, num_train_timesteps, device)
            s = sigmas.view(-1, 1, 1, 1)
            output = transformer(
                hidden_states=(1.0 - s) * latents + s * noise,
                encoder_hidden_states=hidden,
                pooled_projections=pooled,
                timestep=sigmas * num_train_timesteps,
                return_dict=False,
            )[0]
            loss = torch.nn.functional.mse_loss(output.float(), (noise - latents).float())
            optimizer_step(loss, params, optimizer, config.clip_grad_norm)
            times.append(time.perf_counter())
            cpu_times.append(time.process_time())
        trained = sum(p.numel() for p in params)
    cpu = step_durations(cpu_times, warmup, steps)
    return Run(BARE, step_durations(times, warmup, steps), memory.peak_bytes, cpu), trained


def compare_sd3_overhead(steps: int = 10, warmup: int = 2, repeat: int = 3, progress=print) -> dict:
    """Median steps/s of ours and of the bare loop over alternating repetitions, their ratio (also from the steps'
    CPU time), and the trained parameter count, checked to be the same in both loops."""
    return compare_with_bare("sd3", sd3_config, run_bare, steps, warmup, repeat, progress, check_trained=True)
