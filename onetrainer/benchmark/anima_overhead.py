"""What the trainer adds per step on Anima: `run_training` against a bare diffusers + peft loop doing the same maths.

Both train a LoRA (rank 4 on OneTrainer's `attn-mlp` layers: each block's self-attention, cross-attention and MLP) on
the tiny Anima model (`tiny:anima`) at 64 px, batch 2, AdamW, gradient clipping, the text encoder frozen, σ drawn
logit-normally (as OneTrainer's Anima presets train) and shifted by `timestep_shift`. The bare loop takes
`AnimaModularPipeline`'s components and caches in memory up front the VAE's latents of each image (one frame,
normalised per channel by `latents_mean` / `latents_std`) and each caption's text as the pipeline conditions it (its
text-encoder step, then the LLM adapter: [512, width], zeros after the T5 tokens). Each step draws the noise and σ
(`family_overhead.sample_sigmas`), mixes x_t = (1 − σ)·x0 + σ·ε, calls the transformer on the one-frame latents with
a zero padding mask and timestep σ, and trains the velocity ε − x0 with MSE. The driver and its timing:
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
MODEL = "tiny:anima"


def anima_config(workdir: Path, device: torch.device):
    return comparable_lora_config(
        workdir,
        device,
        "Anima",
        {
            "model_type": "ANIMA",
            "base_model_name": MODEL,
            "resolution": str(RESOLUTION),
            "layer_filter_preset": "attn-mlp",
            "timestep_distribution": "LOGIT_NORMAL",  # OneTrainer's Anima presets
            "transformer": {"gradient_checkpointing": False},
        },
    )


class AnimaBareLoop(BareLoop):
    def __init__(self, config, device: torch.device) -> None:
        from onetrainer.families.anima import allow_padding_mask_resize

        super().__init__(config, device)
        allow_padding_mask_resize()
        self.pipe, self.transformer, self.params, self.optimizer = bare_pipeline_lora("ModularPipeline", config, device)
        self.num_train_timesteps = int(self.pipe.scheduler.config.num_train_timesteps)

    def encode_image(self, pixels: torch.Tensor) -> torch.Tensor:
        vae = self.pipe.vae
        z = vae.encode(pixels[None, :, None]).latent_dist.mode()[0, :, 0]
        mean = torch.tensor(vae.config.latents_mean, device=z.device).view(-1, 1, 1)
        std = torch.tensor(vae.config.latents_std, device=z.device).view(-1, 1, 1)
        return (z - mean) / std

    def encode_caption(self, caption: str):
        from diffusers.modular_pipelines.anima.before_denoise import AnimaTextConditioningStep
        from diffusers.modular_pipelines.anima.encoders import AnimaTextEncoderStep

        encoded = AnimaTextEncoderStep.encode_prompt(
            self.pipe, [caption], prepare_unconditional_embeds=False, device=self.device
        )
        text = AnimaTextConditioningStep._condition_prompt_embeds(
            self.pipe,
            encoded["qwen_prompt_embeds"],
            encoded["qwen_attention_mask"],
            encoded["t5_input_ids"],
            encoded["t5_attention_mask"],
            self.device,
            torch.float32,
            torch.float32,
        )
        return text[0]

    def cached(self) -> None:
        self.pipe = None

    def loss(self, latents: torch.Tensor, texts: list) -> torch.Tensor:
        noise = torch.randn_like(latents)
        sigmas = sample_sigmas(len(latents), self.config, self.num_train_timesteps, self.device)
        s = sigmas.view(-1, 1, 1, 1)
        noisy = (1.0 - s) * latents + s * noise
        height, width = latents.shape[-2:]
        output = self.transformer(
            hidden_states=noisy[:, :, None],
            timestep=sigmas,
            encoder_hidden_states=torch.stack(texts),
            padding_mask=latents.new_zeros(1, 1, height * 8, width * 8),
            return_dict=False,
        )[0][:, :, 0]
        return torch.nn.functional.mse_loss(output.float(), (noise - latents).float())


OVERHEAD = FamilyOverhead(
    part="anima",
    label="tiny Anima",
    help="the same on tiny Anima: Qwen3's states through the LLM adapter (512 tokens), the video VAE's normalised "
    "one-frame latents, a zero padding mask",
    config=anima_config,
    bare=AnimaBareLoop,
    resolution=RESOLUTION,
    check_trained=True,
)
