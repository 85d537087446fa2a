"""What the trainer adds per step on Ideogram 4: `run_training` against a bare diffusers + peft loop doing the same
maths.

Both train a LoRA (rank 4 on OneTrainer's `attn-mlp` layers: the blocks' attention and SwiGLU) on the tiny Ideogram 4
model (`tiny:ideogram4`) at 64 px, batch 2, AdamW, gradient clipping, Qwen3-VL frozen, σ drawn logit-normally and
shifted by `timestep_shift`. The bare loop takes `Ideogram4Pipeline`'s components and caches in memory up front each
image's VAE latents, patched 2x2 into tokens in the order the pipeline unpatches them and normalised there by the VAE's
batch-norm statistics, and each caption's text features of `encode_prompt` (its own tokens). Each step packs the
batch's captions before the image tokens as the pipeline does (left-padded text blocks, `_prepare_ids`), draws the
noise and σ (`family_overhead.sample_sigmas`), mixes x_t = (1 − σ)·x0 + σ·ε, calls the transformer with the time
1 − σ and trains its output against x0 − ε with MSE. The driver and its timing: `family_overhead.py`.
"""

from __future__ import annotations

from pathlib import Path

import torch

from onetrainer.benchmark.family_overhead import (
    BareLoop,
    FamilyOverhead,
    bare_pipeline_lora,
    comparable_lora_config,
    sample_sigmas,
)

RESOLUTION = 64
MODEL = "tiny:ideogram4"
CAPTION_TOKENS = 256  # room for any caption of the benchmark's images (the pipeline raises on a longer one)
TEXT_INDICATOR = 3  # the pipeline's LLM_TOKEN_INDICATOR


def ideogram4_config(workdir: Path, device: torch.device):
    return comparable_lora_config(
        workdir,
        device,
        "Ideogram 4",
        {
            "model_type": "IDEOGRAM_4",
            "base_model_name": MODEL,
            "resolution": str(RESOLUTION),
            "layer_filter_preset": "attn-mlp",
            "timestep_distribution": "LOGIT_NORMAL",
            "transformer": {"gradient_checkpointing": False},
        },
    )


class Ideogram4BareLoop(BareLoop):
    def __init__(self, config, device: torch.device) -> None:
        super().__init__(config, device)
        self.pipe, self.transformer, self.params, self.optimizer = bare_pipeline_lora(
            "Ideogram4Pipeline", config, device
        )
        self.prepare_ids = type(self.pipe)._prepare_ids
        self.num_train_timesteps = int(self.pipe.scheduler.config.num_train_timesteps)

    def encode_image(self, pixels: torch.Tensor) -> torch.Tensor:
        vae = self.pipe.vae
        latents = vae.encode(pixels[None]).latent_dist.mode()
        _, c, h, w = latents.shape
        tokens = latents.view(1, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 3, 5, 1).reshape(1, -1, 4 * c)
        mean = vae.bn.running_mean.view(1, 1, -1)
        std = torch.sqrt(vae.bn.running_var.view(1, 1, -1) + vae.config.batch_norm_eps)
        self.grid = (h // 2, w // 2)
        return ((tokens - mean) / std)[0]

    def encode_caption(self, caption: str):
        features, _, _, indicator = self.pipe.encode_prompt(caption, 1, 1, CAPTION_TOKENS, self.device)
        return features[0, :CAPTION_TOKENS][indicator[0, :CAPTION_TOKENS] == TEXT_INDICATOR]

    def cached(self) -> None:
        self.pipe = None

    def loss(self, latents: torch.Tensor, texts: list) -> torch.Tensor:
        count, width = len(texts), texts[0].shape[-1]
        lengths = [len(t) for t in texts]
        block = max(lengths)
        text = latents.new_zeros(count, block + latents.shape[1], width)
        for i, row in enumerate(texts):
            text[i, block - len(row) : block] = row
        positions, segments, indicator = self.prepare_ids(lengths, *self.grid, block, self.device)
        noise = torch.randn_like(latents)
        sigmas = sample_sigmas(count, self.config, self.num_train_timesteps, self.device)
        s = sigmas.view(-1, 1, 1)
        noisy = (1.0 - s) * latents + s * noise
        hidden = torch.cat([latents.new_zeros(count, block, latents.shape[-1]), noisy], dim=1)
        output = self.transformer(hidden, 1.0 - sigmas, text, positions, segments, indicator, return_dict=False)[0]
        return torch.nn.functional.mse_loss(output[:, block:].float(), (latents - noise).float())


OVERHEAD = FamilyOverhead(
    part="ideogram4",
    label="tiny Ideogram 4",
    help="the same on tiny Ideogram 4: 13 of Qwen3-VL's layers side by side, Flux.2's VAE latents patched and "
    "normalised by its batch-norm statistics, the packed [text][image] DiT's LoRA",
    config=ideogram4_config,
    bare=Ideogram4BareLoop,
    resolution=RESOLUTION,
    check_trained=True,
)
