"""What the trainer adds per step on Stable Diffusion 3.5: `run_training` against a bare diffusers + peft loop doing the
same maths.

Both train a LoRA (rank 4 on the attention layers, the family's `attn-only` preset) on the tiny SD 3.5 Medium model
(`tiny:sd35-medium`: MMDiT-X, qk-norm) at 64 px, batch 2, AdamW, gradient clipping, the three text encoders frozen, σ
drawn logit-normally (as OneTrainer's SD3 presets train), shifted by `timestep_shift` as our schedule shifts it. The
bare loop takes `StableDiffusion3Pipeline`'s components and caches in memory up front what the diffusers SD3 LoRA
example caches: the VAE latents, shifted and scaled ((z − shift)·scale), and `encode_prompt`'s joined hidden states and
pooled outputs (T5's 256 tokens). Each step draws the noise and σ (`family_overhead.sample_sigmas`), mixes
x_t = (1 − σ)·x0 + σ·ε, calls the transformer with timestep σ·1000, and trains the velocity ε − x0 with MSE.
The driver and its timing: `family_overhead.py`.
"""

from __future__ import annotations

from pathlib import Path

import torch

from onetrainer.benchmark.family_overhead import (
    FLOW_BARE_SETTINGS,
    BareLoop,
    FamilyOverhead,
    bare_pipeline_lora,
    comparable_lora_config,
    sample_sigmas,
)

RESOLUTION = 64
MODEL = "tiny:sd35-medium"

# What the bare loop implements beyond the shared LoRA settings; `sd3_config` refuses a config that asks otherwise.
_SD3_BARE_SETTINGS = {
    **FLOW_BARE_SETTINGS,
    "text_encoder_2.train": False,
    "text_encoder_2.dropout_probability": 0.0,
    "text_encoder_3.train": False,
    "text_encoder_3.dropout_probability": 0.0,
}


def sd3_config(workdir: Path, device: torch.device):
    return comparable_lora_config(
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
        _SD3_BARE_SETTINGS,
    )


class SD3BareLoop(BareLoop):
    def __init__(self, config, device: torch.device) -> None:
        super().__init__(config, device)
        self.pipe, self.transformer, self.params, self.optimizer = bare_pipeline_lora(
            "StableDiffusion3Pipeline", config, device
        )
        self.vae = self.pipe.vae
        self.num_train_timesteps = int(self.pipe.scheduler.config.num_train_timesteps)

    def encode_image(self, pixels: torch.Tensor) -> torch.Tensor:
        z = self.vae.encode(pixels[None]).latent_dist.mode()[0]
        return (z - self.vae.config.shift_factor) * self.vae.config.scaling_factor

    def encode_caption(self, caption: str):
        hidden, _, pooled, _ = self.pipe.encode_prompt(
            caption, caption, caption, device=self.device, do_classifier_free_guidance=False
        )
        return hidden[0], pooled[0]

    def cached(self) -> None:
        self.pipe = None

    def loss(self, latents: torch.Tensor, texts: list) -> torch.Tensor:
        hidden = torch.stack([t[0] for t in texts])
        pooled = torch.stack([t[1] for t in texts])
        noise = torch.randn_like(latents)
        sigmas = sample_sigmas(len(latents), self.config, self.num_train_timesteps, self.device)
        s = sigmas.view(-1, 1, 1, 1)
        output = self.transformer(
            hidden_states=(1.0 - s) * latents + s * noise,
            encoder_hidden_states=hidden,
            pooled_projections=pooled,
            timestep=sigmas * self.num_train_timesteps,
            return_dict=False,
        )[0]
        return torch.nn.functional.mse_loss(output.float(), (noise - latents).float())


OVERHEAD = FamilyOverhead(
    part="sd3",
    label="tiny SD 3.5 Medium",
    help="the same on tiny SD 3.5 Medium: CLIP-L + CLIP-G + T5, the MMDiT-X transformer, logit-normal flow matching",
    config=sd3_config,
    bare=SD3BareLoop,
    resolution=RESOLUTION,
    check_trained=True,
)
