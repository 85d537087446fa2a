"""What the trainer adds per step on Flux.2 [klein]: `run_training` against a bare diffusers + peft loop doing the
same maths.

Both train a LoRA (rank 4 on OneTrainer's `blocks` layers) on the tiny Flux.2 [klein] model (`tiny:flux2-klein`) at
64 px, batch 2, AdamW, gradient clipping, the text encoder frozen, σ drawn logit-normally and shifted by
`timestep_shift`. The bare loop takes `Flux2KleinPipeline`'s components and caches in memory up front each image's
latents as the pipeline encodes a reference (`_encode_vae_image`: the VAE's mode, patchified 2x2 and normalised by the
VAE's batch-norm statistics) and `encode_prompt`'s states of each caption (Qwen3's chat template, 512 tokens, three
layers side by side). Each step draws the noise and σ (`family_overhead.sample_sigmas`), mixes x_t = (1 − σ)·x0 + σ·ε,
calls the transformer on the packed tokens with the pipeline's position ids and timestep σ (klein: no guidance), and
trains the velocity ε − x0 with MSE. The driver and its timing: `family_overhead.py`.
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
MODEL = "tiny:flux2-klein"


def flux2_config(workdir: Path, device: torch.device):
    return comparable_lora_config(
        workdir,
        device,
        "Flux.2 [klein]",
        {
            "model_type": "FLUX_2",
            "base_model_name": MODEL,
            "resolution": str(RESOLUTION),
            "layer_filter_preset": "blocks",  # OneTrainer's Flux 2 LoRA presets
            "timestep_distribution": "LOGIT_NORMAL",
            "dynamic_timestep_shifting": False,
            "transformer": {"gradient_checkpointing": False},
        },
    )


class Flux2BareLoop(BareLoop):
    def __init__(self, config, device: torch.device) -> None:
        super().__init__(config, device)
        self.pipe, self.transformer, self.params, self.optimizer = bare_pipeline_lora(
            "Flux2KleinPipeline", config, device
        )
        self.pipeline_class = type(self.pipe)  # its static helpers pack tokens and make ids after the pipe is gone
        self.num_train_timesteps = int(self.pipe.scheduler.config.num_train_timesteps)

    def encode_image(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.pipe._encode_vae_image(pixels[None], None)[0]

    def encode_caption(self, caption: str) -> torch.Tensor:
        hidden, _ids = self.pipe.encode_prompt(caption, device=self.device)
        return hidden[0]

    def cached(self) -> None:
        self.pipe = None

    def loss(self, latents: torch.Tensor, texts: list) -> torch.Tensor:
        pipeline = self.pipeline_class
        hidden = torch.stack(texts)
        noise = torch.randn_like(latents)
        sigmas = sample_sigmas(len(latents), self.config, self.num_train_timesteps, self.device)
        s = sigmas.view(-1, 1, 1, 1)
        noisy = (1.0 - s) * latents + s * noise
        output = self.transformer(
            hidden_states=pipeline._pack_latents(noisy),
            encoder_hidden_states=hidden,
            timestep=sigmas,
            img_ids=pipeline._prepare_latent_ids(noisy).to(self.device),
            txt_ids=pipeline._prepare_text_ids(hidden).to(self.device),
            guidance=None,
            return_dict=False,
        )[0]
        target = pipeline._pack_latents(noise - latents)
        return torch.nn.functional.mse_loss(output.float(), target.float())


OVERHEAD = FamilyOverhead(
    part="flux2",
    label="tiny Flux.2 [klein]",
    help="the same on tiny Flux.2 [klein]: Qwen3's three layers of states, latents normalised by the VAE's batch-norm "
    "statistics over 2x2 patches, 4-axis position ids",
    config=flux2_config,
    bare=Flux2BareLoop,
    resolution=RESOLUTION,
    check_trained=True,
)
