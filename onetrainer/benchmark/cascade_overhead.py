"""What the trainer adds per step on Stable Cascade: `run_training` against a bare diffusers + peft loop doing the same
maths.

Both train a LoRA on every linear layer of the tiny Stable Cascade prior (`tiny:cascade`, stage C at the real depth)
at 128 px, batch 2, AdamW, gradient clipping, the text encoder frozen, the loss weighted with P2 (γ = 1). The bare
loop caches the EfficientNet latents and CLIP outputs (last hidden state, pooled text embedding) in memory up front;
each step draws noise and a uniform time, remaps it as Cascade does (t + 0.001), noises with the continuous cosine
schedule written out here, and trains the prior's noise prediction. The effnet is this trainer's own module (no
library has one). Timing as `overhead.py`.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import torch

from onetrainer.benchmark.family_overhead import batch_order, compare_with_bare, lora_config, optimizer_step
from onetrainer.benchmark.memory import PeakMemory
from onetrainer.benchmark.overhead import BARE, Run, _check_counts, _load_pixels, _training_images, step_durations

RESOLUTION = 128
COSINE_S = 0.008


def cascade_config(workdir: Path, device: torch.device):
    return lora_config(
        workdir,
        device,
        "Cascade",
        {
            "model_type": "STABLE_CASCADE_1",
            "base_model_name": "tiny:cascade",
            "resolution": str(RESOLUTION),
            "layer_filter_preset": "full",
            "loss_weight_fn": "P2",
            "loss_weight_strength": 1.0,
            "prior": {"gradient_checkpointing": False, "weight_dtype": "FLOAT_32"},
        },
    )


def _alpha_bar(t: torch.Tensor) -> torch.Tensor:
    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.cos((x + COSINE_S) / (1 + COSINE_S) * math.pi / 2) ** 2

    return (f(t) / f(torch.zeros_like(t))).clamp(1e-4, 0.9999)


def run_bare(config, images: Path, device: torch.device, steps: int, warmup: int) -> Run:
    from diffusers import StableCascadeUNet
    from peft import LoraConfig, inject_adapter_in_model
    from transformers import CLIPTextModelWithProjection, CLIPTokenizer

    from onetrainer.benchmark.overhead import lora_targets
    from onetrainer.families import effnet
    from onetrainer.tiny.effnet import build_effnet_encoder
    from onetrainer.tiny.source import resolve_local

    _check_counts(steps, warmup)
    with PeakMemory(device) as memory:
        model_dir = str(resolve_local(config.base_model_name))
        prior = StableCascadeUNet.from_pretrained(model_dir, subfolder="prior", local_files_only=True)
        text_encoder = CLIPTextModelWithProjection.from_pretrained(
            model_dir, subfolder="text_encoder", local_files_only=True
        )
        tokenizer = CLIPTokenizer.from_pretrained(model_dir, subfolder="tokenizer", local_files_only=True)
        encoder = build_effnet_encoder(wuerstchen=False)
        for module in (prior, text_encoder, encoder):
            module.requires_grad_(False)
            module.to(device)
        # peft cannot put a rank-r LoRA on the prior's depthwise convolutions (our family leaves them out too).
        modules = dict(prior.named_modules())
        targets = [n for n in lora_targets(prior, config) if getattr(modules[n], "groups", 1) == 1]
        lora = LoraConfig(r=config.lora_rank, lora_alpha=config.lora_alpha, target_modules=targets)
        inject_adapter_in_model(lora, prior)
        params = [p for p in prior.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=config.learning_rate, betas=(0.9, 0.999), weight_decay=1e-2, eps=1e-8)
        prior.train()

        samples = _training_images(images)
        with torch.no_grad():
            latents_of = {
                p: encoder(effnet.preprocess(((_load_pixels(p, RESOLUTION) + 1) / 2)[None].to(device)))[0]
                for p, _ in samples
            }
            text_of = {}
            for caption in {c for _, c in samples}:
                tokens = tokenizer([caption], padding="max_length", max_length=77, truncation=True, return_tensors="pt")
                mask = tokens.attention_mask.to(device)
                out = text_encoder(tokens.input_ids.to(device), attention_mask=mask, output_hidden_states=True)
                text_of[caption] = (out.hidden_states[-1][0], out.text_embeds[0])
        batches = batch_order(len(samples), config.batch_size)
        times: list[float] = []
        batch_size = config.batch_size
        clip_img = torch.zeros(batch_size, 1, prior.config.clip_image_in_channels, device=device)
        for _ in range(warmup + steps):
            batch = [samples[i] for i in next(batches)]
            latents = torch.stack([latents_of[p] for p, _ in batch])
            hidden = torch.stack([text_of[c][0] for _, c in batch])
            pooled = torch.stack([text_of[c][1] for _, c in batch])[:, None]
            noise = torch.randn_like(latents)
            t = (torch.rand(batch_size, device=device) + 0.001).clamp(0.001, 1.0)
            alpha_bar = _alpha_bar(t).view(-1, 1, 1, 1)
            noisy = alpha_bar.sqrt() * latents + (1 - alpha_bar).sqrt() * noise
            predicted = prior(noisy, t, clip_text_pooled=pooled, clip_text=hidden, clip_img=clip_img).sample
            per_sample = (predicted.float() - noise.float()).pow(2).mean(dim=(1, 2, 3))
            snr = alpha_bar.flatten() / (1 - alpha_bar.flatten())
            loss = (per_sample / (1 + snr) ** config.loss_weight_strength).mean()
            optimizer_step(loss, params, optimizer, config.clip_grad_norm)
            times.append(time.perf_counter())
    return Run(BARE, step_durations(times, warmup, steps), memory.peak_bytes)


def compare_cascade_overhead(steps: int = 10, warmup: int = 2, repeat: int = 3, progress=print) -> dict:
    """Median steps/s of ours and of the bare loop over alternating repetitions, and their ratio."""
    return compare_with_bare("cascade", cascade_config, run_bare, steps, warmup, repeat, progress)
