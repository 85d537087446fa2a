"""What the trainer adds per step on Flux.1: `run_training` against a bare diffusers + peft loop doing the same maths.

Both train a LoRA (rank 4 on the attention and MLP layers, the family's `attn-mlp` preset) on the tiny FLUX.1-dev model
(`tiny:flux-dev`) at 64 px, batch 2, AdamW, gradient clipping, both text encoders frozen, σ drawn logit-normally (as
OneTrainer's Flux LoRA preset trains). The bare loop takes `FluxPipeline`'s components and caches in memory up front
what the diffusers Flux LoRA example caches: the VAE latents, shifted and scaled ((z − shift)·scale), and
`encode_prompt`'s CLIP pooled output and T5 hidden states (512 tokens). Each step then draws the noise and σ (a
logit-normal draw through diffusers' `compute_density_for_timestep_sampling`, shifted by `timestep_shift` and placed
on the T training steps as our schedule does: σ = (⌊T·u⌋ + 1)/T), mixes x_t = (1 − σ)·x0 + σ·ε, packs it 2x2 with
`FluxPipeline._pack_latents`, builds the image ids with `_prepare_latent_image_ids` and zero text ids, calls the
transformer with timestep σ and the fixed training guidance (`transformer.guidance_scale`), unpacks, and trains the
velocity ε − x0 with MSE. The driver and its timing: `family_overhead.py`.
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
MODEL = "tiny:flux-dev"
T5_TOKENS = 512  # FLUX.1-dev's prompt length (what our family and the pipeline use for dev)

# What the bare loop implements beyond the shared LoRA settings; `flux_config` refuses a config that asks otherwise.
_FLUX_BARE_SETTINGS = {
    **FLOW_BARE_SETTINGS,
    "text_encoder_2_sequence_length": T5_TOKENS,
    "text_encoder_2.train": False,
    "text_encoder_2.dropout_probability": 0.0,
}


def flux_config(workdir: Path, device: torch.device):
    return comparable_lora_config(
        workdir,
        device,
        "Flux",
        {
            "model_type": "FLUX_DEV_1",
            "base_model_name": MODEL,
            "resolution": str(RESOLUTION),
            "layer_filter_preset": "attn-mlp",
            "text_encoder_2_sequence_length": T5_TOKENS,
            "timestep_distribution": "LOGIT_NORMAL",  # OneTrainer's Flux LoRA preset
            "transformer": {"gradient_checkpointing": False},
            "text_encoder_2": {"train": False},
        },
        _FLUX_BARE_SETTINGS,
    )


class FluxBareLoop(BareLoop):
    def __init__(self, config, device: torch.device) -> None:
        from diffusers import FluxPipeline

        super().__init__(config, device)
        self.pipeline_class = FluxPipeline  # its static helpers pack the latents and make their ids
        self.pipe, self.transformer, self.params, self.optimizer = bare_pipeline_lora("FluxPipeline", config, device)
        self.vae = self.pipe.vae
        self.num_train_timesteps = int(self.pipe.scheduler.config.num_train_timesteps)
        self.guidance_scale = float(config.transformer.guidance_scale)
        self.vae_scale_factor = self.pipe.vae_scale_factor

    def encode_image(self, pixels: torch.Tensor) -> torch.Tensor:
        z = self.vae.encode(pixels[None]).latent_dist.mode()[0]
        return (z - self.vae.config.shift_factor) * self.vae.config.scaling_factor

    def encode_caption(self, caption: str):
        hidden, pooled, _ = self.pipe.encode_prompt(caption, device=self.device, max_sequence_length=T5_TOKENS)
        return hidden[0], pooled[0]

    def cached(self) -> None:
        self.pipe = None

    def loss(self, latents: torch.Tensor, texts: list) -> torch.Tensor:
        device = self.device
        hidden = torch.stack([t[0] for t in texts])
        pooled = torch.stack([t[1] for t in texts])
        count, channels, height, width = latents.shape
        noise = torch.randn_like(latents)
        sigmas = sample_sigmas(count, self.config, self.num_train_timesteps, device)
        s = sigmas.view(-1, 1, 1, 1)
        noisy = (1.0 - s) * latents + s * noise
        packed = self.pipeline_class._pack_latents(noisy, count, channels, height, width)
        image_ids = self.pipeline_class._prepare_latent_image_ids(count, height // 2, width // 2, device, latents.dtype)
        text_ids = torch.zeros(hidden.shape[1], 3, device=device, dtype=latents.dtype)
        guidance = None
        if self.transformer.config.guidance_embeds:
            guidance = torch.full((count,), self.guidance_scale, device=device, dtype=latents.dtype)
        output = self.transformer(
            hidden_states=packed,
            timestep=sigmas,  # σ: the transformer multiplies by 1000 itself
            guidance=guidance,
            pooled_projections=pooled,
            encoder_hidden_states=hidden,
            txt_ids=text_ids,
            img_ids=image_ids,
            return_dict=False,
        )[0]
        scale = self.vae_scale_factor
        predicted = self.pipeline_class._unpack_latents(output, height * scale, width * scale, scale)
        return torch.nn.functional.mse_loss(predicted.float(), (noise - latents).float())


def full_size_gpu_step(steps: int, warmup: int) -> dict:
    from onetrainer.benchmark.flux_gpu import run_flux_gpu_part

    print("\nFull-size Flux.1-dev LoRA step (CUDA only):")
    return run_flux_gpu_part(steps, max(warmup - 1, 1))


OVERHEAD = FamilyOverhead(
    part="flux",
    label="tiny FLUX.1-dev",
    help="the same on tiny FLUX.1-dev: packed latents, CLIP pooled + T5, the guidance input, logit-normal flow "
    "matching; with CUDA also the full-size Flux.1-dev LoRA step in bf16 and FLOAT_8 weights, it/s and peak VRAM, "
    "otherwise reported as not measured",
    config=flux_config,
    bare=FluxBareLoop,
    resolution=RESOLUTION,
    check_trained=True,
    extras={"gpu": full_size_gpu_step},
)
