"""What the trainer adds per step on Krea 2: `run_training` against a bare diffusers + peft loop doing the same maths.

Both train a LoRA (rank 4 on OneTrainer's `attn-mlp` layers: the blocks' and the text fusion's attention and
feed-forward) on the tiny Krea 2 model (`tiny:krea2`) at 64 px, batch 2, AdamW, gradient clipping, the text encoder
frozen, σ drawn logit-normally (as OneTrainer's Krea 2 presets train) and shifted by `timestep_shift`. The bare loop
takes `Krea2Pipeline`'s components and caches in memory up front the VAE's latents of each image (one frame,
normalised per channel by `latents_mean` / `latents_std`) and each caption's attended tokens of `encode_prompt`'s
stacked Qwen3-VL layers. Each step pads the batch's captions to the longest with their mask (none when they are
equally long), draws the noise and σ (`family_overhead.sample_sigmas`), mixes x_t = (1 − σ)·x0 + σ·ε, calls the
transformer on the 2x2-packed latents with the pipeline's positions and timestep σ, and trains the velocity ε − x0
with MSE. The driver and its timing: `family_overhead.py`.
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
MODEL = "tiny:krea2"


def krea2_config(workdir: Path, device: torch.device):
    return comparable_lora_config(
        workdir,
        device,
        "Krea 2",
        {
            "model_type": "KREA_2",
            "base_model_name": MODEL,
            "resolution": str(RESOLUTION),
            "layer_filter_preset": "attn-mlp",
            "timestep_distribution": "LOGIT_NORMAL",  # OneTrainer's Krea 2 presets
            "transformer": {"gradient_checkpointing": False},
        },
    )


def _latents(vae, pixels: torch.Tensor) -> torch.Tensor:
    z = vae.encode(pixels[None, :, None]).latent_dist.mode()[0, :, 0]
    mean = torch.tensor(vae.config.latents_mean, device=z.device).view(-1, 1, 1)
    std = torch.tensor(vae.config.latents_std, device=z.device).view(-1, 1, 1)
    return (z - mean) / std


def _padded(states: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor | None]:
    longest = max(len(s) for s in states)
    hidden = torch.stack([torch.cat([s, s.new_zeros(longest - len(s), *s.shape[1:])]) for s in states])
    mask = torch.stack([torch.arange(longest, device=hidden.device) < len(s) for s in states])
    return hidden, None if bool(mask.all()) else mask


class Krea2BareLoop(BareLoop):
    def __init__(self, config, device: torch.device) -> None:
        super().__init__(config, device)
        self.pipe, self.transformer, self.params, self.optimizer = bare_pipeline_lora("Krea2Pipeline", config, device)
        self.num_train_timesteps = int(self.pipe.scheduler.config.num_train_timesteps)
        self.positions = self.pipe.prepare_position_ids

    def encode_image(self, pixels: torch.Tensor) -> torch.Tensor:
        return _latents(self.pipe.vae, pixels)

    def encode_caption(self, caption: str):
        hidden, mask = self.pipe.encode_prompt(caption, device=self.device)
        return hidden[0][mask[0]]

    def cached(self) -> None:
        self.pipe = None

    def loss(self, latents: torch.Tensor, texts: list) -> torch.Tensor:
        hidden, mask = _padded(texts)
        noise = torch.randn_like(latents)
        sigmas = sample_sigmas(len(latents), self.config, self.num_train_timesteps, self.device)
        s = sigmas.view(-1, 1, 1, 1)
        b, c, h, w = latents.shape
        noisy = ((1.0 - s) * latents + s * noise).view(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5)
        output = self.transformer(
            hidden_states=noisy.reshape(b, (h // 2) * (w // 2), c * 4),
            encoder_hidden_states=hidden,
            timestep=sigmas,
            position_ids=self.positions(hidden.shape[1], h // 2, w // 2, self.device),
            encoder_attention_mask=mask,
            return_dict=False,
        )[0]
        prediction = output.view(b, h // 2, w // 2, c, 2, 2).permute(0, 3, 1, 4, 2, 5).reshape(b, c, h, w)
        return torch.nn.functional.mse_loss(prediction.float(), (noise - latents).float())


OVERHEAD = FamilyOverhead(
    part="krea2",
    label="tiny Krea 2",
    help="the same on tiny Krea 2: Qwen3-VL's stacked layers (each caption's attended tokens), the video VAE's "
    "normalised latents, packed latents at the pipeline's positions",
    config=krea2_config,
    bare=Krea2BareLoop,
    resolution=RESOLUTION,
    check_trained=True,
)
