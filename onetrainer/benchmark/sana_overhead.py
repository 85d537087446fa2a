"""What the trainer adds per step on Sana: `run_training` against a bare diffusers + peft loop doing the same maths.

Both train a LoRA (rank 4 on OneTrainer's `attn-mlp` layers: both attentions and the feed-forward's 1x1 convolutions)
on the tiny Sana model (`tiny:sana`) at 64 px, batch 2, AdamW, gradient clipping, Gemma-2 frozen, σ drawn
logit-normally and shifted by `timestep_shift`. The bare loop takes `SanaPipeline`'s components and caches in memory
up front the DC-AE's latent of each image times its scaling factor and `encode_prompt`'s 300 states of each caption
with their mask (the complex human instruction before it, as the pipeline prompts). Each step draws the noise and σ
(`family_overhead.sample_sigmas`), mixes x_t = (1 − σ)·x0 + σ·ε, calls the transformer with timestep σ·T and the
caption mask, and trains the flow ε − x0 with MSE. The driver and its timing: `family_overhead.py`.
"""

from __future__ import annotations

import inspect
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
MODEL = "tiny:sana"


def sana_config(workdir: Path, device: torch.device):
    return comparable_lora_config(
        workdir,
        device,
        "Sana",
        {
            "model_type": "SANA",
            "base_model_name": MODEL,
            "resolution": str(RESOLUTION),
            "layer_filter_preset": "attn-mlp",
            "timestep_distribution": "LOGIT_NORMAL",
            "transformer": {"gradient_checkpointing": False},
        },
    )


class SanaBareLoop(BareLoop):
    def __init__(self, config, device: torch.device) -> None:
        super().__init__(config, device)
        self.pipe, self.transformer, self.params, self.optimizer = bare_pipeline_lora("SanaPipeline", config, device)
        self.num_train_timesteps = int(self.pipe.scheduler.config.num_train_timesteps)
        call = inspect.signature(type(self.pipe).__call__).parameters
        self.instruction = call["complex_human_instruction"].default  # what the pipeline prompts with

    def encode_image(self, pixels: torch.Tensor) -> torch.Tensor:
        vae = self.pipe.vae
        return vae.encode(pixels[None]).latent[0] * vae.config.scaling_factor

    def encode_caption(self, caption: str):
        hidden, mask, _, _ = self.pipe.encode_prompt(
            caption, False, device=self.device, complex_human_instruction=self.instruction
        )
        return hidden[0], mask[0]

    def cached(self) -> None:
        self.pipe = None

    def loss(self, latents: torch.Tensor, texts: list) -> torch.Tensor:
        hidden = torch.stack([t[0] for t in texts])
        mask = torch.stack([t[1] for t in texts])
        noise = torch.randn_like(latents)
        sigmas = sample_sigmas(len(latents), self.config, self.num_train_timesteps, self.device)
        s = sigmas.view(-1, 1, 1, 1)
        noisy = (1.0 - s) * latents + s * noise
        prediction = self.transformer(
            noisy, encoder_hidden_states=hidden, encoder_attention_mask=mask,
            timestep=sigmas * self.num_train_timesteps, return_dict=False,
        )[0]  # fmt: skip
        return torch.nn.functional.mse_loss(prediction.float(), (noise - latents).float())


OVERHEAD = FamilyOverhead(
    part="sana",
    label="tiny Sana",
    help="the same on tiny Sana: Gemma-2's masked states after the complex human instruction, the DC-AE's latents, "
    "the linear-attention transformer's LoRA on its 1x1 convolutions too",
    config=sana_config,
    bare=SanaBareLoop,
    resolution=RESOLUTION,
    check_trained=True,
)
