"""What the trainer adds per step on Qwen-Image: `run_training` against a bare diffusers + peft loop doing the same
maths.

Both train a LoRA (rank 4 on OneTrainer's `attn-mlp` layers) on the tiny Qwen-Image model (`tiny:qwen-image`) at
64 px, batch 2, AdamW, gradient clipping, the text encoder frozen, σ drawn logit-normally (as OneTrainer's Qwen
presets train) and shifted by `timestep_shift`. The bare loop takes `QwenImagePipeline`'s components and caches in
memory up front the video VAE's latents of each image (one frame, normalised per channel by `latents_mean` /
`latents_std`) and `encode_prompt`'s states of each caption (the template's first 34 tokens dropped). Each step pads
the batch's captions to the longest with their mask (none when they are equally long, as the pipeline passes it),
draws the noise and σ (`family_overhead.sample_sigmas`), mixes x_t = (1 − σ)·x0 + σ·ε, calls the transformer on the 2x2-
packed latents with their grid and timestep σ, and trains the velocity ε − x0 with MSE. The driver and its timing:
`family_overhead.py`.
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
MODEL = "tiny:qwen-image"


def qwen_config(workdir: Path, device: torch.device):
    return comparable_lora_config(
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


class QwenBareLoop(BareLoop):
    def __init__(self, config, device: torch.device) -> None:
        super().__init__(config, device)
        self.pipe, self.transformer, self.params, self.optimizer = bare_pipeline_lora(
            "QwenImagePipeline", config, device
        )
        self.num_train_timesteps = int(self.pipe.scheduler.config.num_train_timesteps)

    def encode_image(self, pixels: torch.Tensor) -> torch.Tensor:
        return _latents(self.pipe.vae, pixels)

    def encode_caption(self, caption: str):
        hidden, mask = self.pipe.encode_prompt(caption, device=self.device)
        return hidden[0] if mask is None else hidden[0][mask[0].bool()]

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
            encoder_hidden_states_mask=mask,
            timestep=sigmas,
            img_shapes=[[(1, h // 2, w // 2)]] * b,
            return_dict=False,
        )[0]
        prediction = output.view(b, h // 2, w // 2, c, 2, 2).permute(0, 3, 1, 4, 2, 5).reshape(b, c, h, w)
        return torch.nn.functional.mse_loss(prediction.float(), (noise - latents).float())


OVERHEAD = FamilyOverhead(
    part="qwen",
    label="tiny Qwen-Image",
    help="the same on tiny Qwen-Image: Qwen2.5-VL's masked states, the video VAE's normalised latents, packed latents "
    "with their grid",
    config=qwen_config,
    bare=QwenBareLoop,
    resolution=RESOLUTION,
    check_trained=True,
)
