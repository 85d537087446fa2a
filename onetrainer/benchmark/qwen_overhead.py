"""What the trainer adds per step on Qwen-Image: `run_training` against a bare diffusers + peft loop doing the same
maths.

Both train a LoRA (rank 4 on OneTrainer's `attn-mlp` layers) on the tiny Qwen-Image model (`tiny:qwen-image`) at
64 px, batch 2, AdamW, gradient clipping, the text encoder frozen, σ drawn logit-normally (as OneTrainer's Qwen
presets train) and shifted by `timestep_shift`. The bare loop takes `QwenImagePipeline`'s components and caches in
memory up front the video VAE's latents of each image (one frame, normalised per channel by `latents_mean` /
`latents_std`) and `encode_prompt`'s states of each caption (the template's first 34 tokens dropped). Each step pads
the batch's captions to the longest with their mask (none when they are equally long, as the pipeline passes it),
draws the noise and σ (`flux_overhead.sample_sigmas`), mixes x_t = (1 − σ)·x0 + σ·ε, calls the transformer on the 2x2-
packed latents with their grid and timestep σ, and trains the velocity ε − x0 with MSE. Timing as `overhead.py`.
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
MODEL = "tiny:qwen-image"

# What the bare loop implements beyond the shared LoRA settings; `qwen_config` refuses a config that asks otherwise.
_QWEN_BARE_SETTINGS = {
    **_BARE_LOOP_SETTINGS,
    "timestep_distribution": "LOGIT_NORMAL",
    "dynamic_timestep_shifting": False,
}


def qwen_config(workdir: Path, device: torch.device):
    config, images = lora_config(
        workdir,
        device,
        "Qwen-Image",
        {
            "model_type": "QWEN",
            "base_model_name": MODEL,
            "resolution": str(RESOLUTION),
            "layer_filter_preset": "attn-mlp",
            "timestep_distribution": "LOGIT_NORMAL",  # OneTrainer's Qwen presets
            "transformer": {"gradient_checkpointing": False},
        },
    )
    different = _beyond_the_bare_loop(config, _QWEN_BARE_SETTINGS)
    if different:
        asked = ", ".join(different)
        raise ValueError(f"the bare Qwen-Image loop does not do what the benchmark config asks for: {asked}")
    return config, images


def _latents(vae, pixels: torch.Tensor) -> torch.Tensor:
    z = vae.encode(pixels[None, :, None]).latent_dist.mode()[0, :, 0]
    mean = torch.tensor(vae.config.latents_mean, device=z.device).view(-1, 1, 1)
    std = torch.tensor(vae.config.latents_std, device=z.device).view(-1, 1, 1)
    return (z - mean) / std


def _padded(states: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor | None]:
    longest = max(len(s) for s in states)
    hidden = torch.stack([torch.cat([s, s.new_zeros(longest - len(s), s.shape[1])]) for s in states])
    mask = torch.stack([torch.arange(longest, device=hidden.device) < len(s) for s in states]).long()
    return hidden, None if bool(mask.all()) else mask


def run_bare(config, images: Path, device: torch.device, steps: int, warmup: int) -> tuple[Run, int]:
    """The bare loop's run and how many parameters it trained."""
    _check_counts(steps, warmup)
    with PeakMemory(device) as memory:
        pipe, transformer, params, optimizer = bare_pipeline_lora("QwenImagePipeline", config, device)
        num_train_timesteps = int(pipe.scheduler.config.num_train_timesteps)
        samples = _training_images(images)
        with torch.no_grad():
            latents_of = {path: _latents(pipe.vae, _load_pixels(path, RESOLUTION).to(device)) for path, _ in samples}
            text_of = {}
            for caption in {c for _, c in samples}:
                hidden, mask = pipe.encode_prompt(caption, device=device)
                text_of[caption] = hidden[0] if mask is None else hidden[0][mask[0].bool()]
        del pipe
        batches = batch_order(len(samples), config.batch_size)
        times: list[float] = []
        cpu_times: list[float] = []
        for _ in range(warmup + steps):
            batch = [samples[i] for i in next(batches)]
            latents = torch.stack([latents_of[p] for p, _ in batch])
            hidden, mask = _padded([text_of[c] for _, c in batch])
            noise = torch.randn_like(latents)
            sigmas = sample_sigmas(len(latents), config, num_train_timesteps, device)
            s = sigmas.view(-1, 1, 1, 1)
            b, c, h, w = latents.shape
            noisy = ((1.0 - s) * latents + s * noise).view(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5)
            output = transformer(
                hidden_states=noisy.reshape(b, (h // 2) * (w // 2), c * 4),
                encoder_hidden_states=hidden,
                encoder_hidden_states_mask=mask,
                timestep=sigmas,
                img_shapes=[[(1, h // 2, w // 2)]] * b,
                return_dict=False,
            )[0]
            prediction = output.view(b, h // 2, w // 2, c, 2, 2).permute(0, 3, 1, 4, 2, 5).reshape(b, c, h, w)
            loss = torch.nn.functional.mse_loss(prediction.float(), (noise - latents).float())
            optimizer_step(loss, params, optimizer, config.clip_grad_norm)
            times.append(time.perf_counter())
            cpu_times.append(time.process_time())
        trained = sum(p.numel() for p in params)
    cpu = step_durations(cpu_times, warmup, steps)
    return Run(BARE, step_durations(times, warmup, steps), memory.peak_bytes, cpu), trained


def compare_qwen_overhead(steps: int = 10, warmup: int = 2, repeat: int = 3, progress=print) -> dict:
    """Median steps/s of ours and of the bare loop over alternating repetitions, their ratio (also from the steps'
    CPU time), and the trained parameter count, checked to be the same in both loops."""
    return compare_with_bare("qwen", qwen_config, run_bare, steps, warmup, repeat, progress, check_trained=True)
