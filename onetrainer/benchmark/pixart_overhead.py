"""What the trainer adds per step on PixArt: `run_training` against a bare diffusers + peft loop doing the same maths.

Both train a LoRA (attention and MLP layers) on the tiny PixArt-Alpha 1024 model (`tiny:pixart`) at 64 px, batch 2,
AdamW, gradient clipping, T5 frozen. The bare loop caches latents and T5 outputs (hidden states and mask) in memory
up front, then each step draws noise and timesteps, runs the transformer with the bucket's resolution / aspect-ratio
conditions and the caption mask, and trains the noise half with MSE plus the variance half with IDDPM's variational
bound (`noise/variational_bound.py`, the noise detached), as our PixArt family does. Timing as `overhead.py`.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from onetrainer.benchmark.family_overhead import batch_order, compare_with_bare, lora_config, optimizer_step
from onetrainer.benchmark.memory import PeakMemory
from onetrainer.benchmark.overhead import BARE, Run, _check_counts, _load_pixels, _training_images, step_durations

RESOLUTION = 64


def pixart_config(workdir: Path, device: torch.device):
    return lora_config(
        workdir,
        device,
        "PixArt",
        {
            "model_type": "PIXART_ALPHA",
            "base_model_name": "tiny:pixart",
            "resolution": str(RESOLUTION),
            "layer_filter_preset": "attn-mlp",
            "transformer": {"gradient_checkpointing": False},
        },
    )


def run_bare(config, images: Path, device: torch.device, steps: int, warmup: int) -> Run:
    from diffusers import DDPMScheduler, PixArtAlphaPipeline
    from peft import LoraConfig, inject_adapter_in_model

    from onetrainer.benchmark.overhead import lora_targets
    from onetrainer.noise.variational_bound import split_learned_variance, variational_bound
    from onetrainer.tiny.source import resolve_local

    _check_counts(steps, warmup)
    with PeakMemory(device) as memory:
        model_dir = str(resolve_local(config.base_model_name))
        pipe = PixArtAlphaPipeline.from_pretrained(model_dir, local_files_only=True)
        transformer, vae, t5, tokenizer = pipe.transformer, pipe.vae, pipe.text_encoder, pipe.tokenizer
        scheduler = DDPMScheduler.from_pretrained(model_dir, subfolder="scheduler", local_files_only=True)
        del pipe
        for module in (transformer, vae, t5):
            module.requires_grad_(False)
            module.to(device)
        # PixArt's transformer has no diffusers adapter mixin: peft's injection, as our LoRA method does.
        targets = lora_targets(transformer, config)
        lora = LoraConfig(r=config.lora_rank, lora_alpha=config.lora_alpha, target_modules=targets)
        inject_adapter_in_model(lora, transformer)
        params = [p for p in transformer.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=config.learning_rate, betas=(0.9, 0.999), weight_decay=1e-2, eps=1e-8)
        transformer.train()
        alphas_cumprod = scheduler.alphas_cumprod.to(device)
        betas = scheduler.betas.to(device)

        samples = _training_images(images)
        with torch.no_grad():
            latents_of = {
                p: vae.encode(_load_pixels(p, RESOLUTION)[None].to(device)).latent_dist.mode()[0]
                * vae.config.scaling_factor
                for p, _ in samples
            }
            text_of = {}
            for caption in {c for _, c in samples}:
                tokens = tokenizer(
                    [caption], padding="max_length", max_length=120, truncation=True, return_tensors="pt"
                )
                mask = tokens.attention_mask.to(device)
                text_of[caption] = (t5(tokens.input_ids.to(device), attention_mask=mask).last_hidden_state[0], mask[0])
        batches = batch_order(len(samples), config.batch_size)
        times: list[float] = []
        batch_size = config.batch_size
        added = {
            "resolution": torch.tensor([[float(RESOLUTION)] * 2] * batch_size, device=device),
            "aspect_ratio": torch.ones(batch_size, 1, device=device),
        }
        for _ in range(warmup + steps):
            batch = [samples[i] for i in next(batches)]
            latents = torch.stack([latents_of[p] for p, _ in batch])
            hidden = torch.stack([text_of[c][0] for _, c in batch])
            mask = torch.stack([text_of[c][1] for _, c in batch])
            noise = torch.randn_like(latents)
            timesteps = torch.randint(0, scheduler.config.num_train_timesteps, (len(latents),), device=device)
            noisy = scheduler.add_noise(latents, noise, timesteps)
            output = transformer(
                noisy, encoder_hidden_states=hidden, timestep=timesteps, added_cond_kwargs=added,
                encoder_attention_mask=mask,
            ).sample  # fmt: skip
            predicted, variance = split_learned_variance(output)
            vb = variational_bound(predicted, variance, latents, noisy, timesteps, alphas_cumprod, betas)
            loss = torch.nn.functional.mse_loss(predicted.float(), noise.float()) + vb.mean()
            optimizer_step(loss, params, optimizer, config.clip_grad_norm)
            times.append(time.perf_counter())
    return Run(BARE, step_durations(times, warmup, steps), memory.peak_bytes)


def compare_pixart_overhead(steps: int = 10, warmup: int = 2, repeat: int = 3, progress=print) -> dict:
    """Median steps/s of ours and of the bare loop over alternating repetitions, and their ratio."""
    return compare_with_bare("pixart", pixart_config, run_bare, steps, warmup, repeat, progress)
