"""What the trainer adds per step on ERNIE-Image: `run_training` against a bare diffusers + peft loop doing the same
maths.

Both train a LoRA (rank 4 on OneTrainer's `attn-mlp` layers: the blocks' self-attention and MLP) on the tiny ERNIE-Image
model (`tiny:ernie`) at 64 px, batch 2, AdamW, gradient clipping, Ministral frozen, σ drawn logit-normally and shifted
by `timestep_shift`. The bare loop takes `ErnieImagePipeline`'s components and caches in memory up front each image's
VAE latents, patchified 2x2 and normalised by the VAE's batch-norm statistics (the epsilon the pipeline decodes with),
and `encode_prompt`'s states of each caption (its own tokens). Each step pads the batch's captions as the pipeline does
(`_pad_text`: the states and each one's token count), draws the noise and σ (`family_overhead.sample_sigmas`), mixes
x_t = (1 − σ)·x0 + σ·ε, calls the transformer with timestep σ·T and trains the flow ε − x0 with MSE. The driver and its
timing: `family_overhead.py`.
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
MODEL = "tiny:ernie"
BATCH_NORM_EPS = 1e-5  # what ErnieImagePipeline decodes with


def ernie_config(workdir: Path, device: torch.device):
    return comparable_lora_config(
        workdir,
        device,
        "ERNIE-Image",
        {
            "model_type": "ERNIE",
            "base_model_name": MODEL,
            "resolution": str(RESOLUTION),
            "layer_filter_preset": "attn-mlp",
            "timestep_distribution": "LOGIT_NORMAL",
            "transformer": {"gradient_checkpointing": False},
        },
    )


class ErnieBareLoop(BareLoop):
    def __init__(self, config, device: torch.device) -> None:
        super().__init__(config, device)
        self.pipe, self.transformer, self.params, self.optimizer = bare_pipeline_lora(
            "ErnieImagePipeline", config, device
        )
        self.pad_text = type(self.pipe)._pad_text
        self.num_train_timesteps = int(self.pipe.scheduler.config.num_train_timesteps)
        self.text_width = int(self.transformer.config.text_in_dim)

    def encode_image(self, pixels: torch.Tensor) -> torch.Tensor:
        vae = self.pipe.vae
        patches = self.pipe._patchify_latents(vae.encode(pixels[None]).latent_dist.mode())
        mean = vae.bn.running_mean.view(1, -1, 1, 1)
        std = torch.sqrt(vae.bn.running_var.view(1, -1, 1, 1) + BATCH_NORM_EPS)
        return ((patches - mean) / std)[0]

    def encode_caption(self, caption: str):
        return self.pipe.encode_prompt(caption, self.device)[0]

    def cached(self) -> None:
        self.pipe = None

    def loss(self, latents: torch.Tensor, texts: list) -> torch.Tensor:
        text, lengths = self.pad_text(texts, self.device, latents.dtype, self.text_width)
        noise = torch.randn_like(latents)
        sigmas = sample_sigmas(len(latents), self.config, self.num_train_timesteps, self.device)
        s = sigmas.view(-1, 1, 1, 1)
        noisy = (1.0 - s) * latents + s * noise
        prediction = self.transformer(noisy, sigmas * self.num_train_timesteps, text, lengths, return_dict=False)[0]
        return torch.nn.functional.mse_loss(prediction.float(), (noise - latents).float())


OVERHEAD = FamilyOverhead(
    part="ernie",
    label="tiny ERNIE-Image",
    help="the same on tiny ERNIE-Image: Ministral's second-to-last states, Flux.2's VAE latents normalised by its "
    "batch-norm statistics, the shared-AdaLN DiT's LoRA",
    config=ernie_config,
    bare=ErnieBareLoop,
    resolution=RESOLUTION,
    check_trained=True,
)
