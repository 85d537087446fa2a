"""What the trainer adds per step on Lumina 2: `run_training` against a bare diffusers + peft loop doing the same
maths.

Both train a LoRA (rank 4 on the `attn-mlp` layers: the joint blocks' and the refiners' attention and feed-forward)
on the tiny Lumina 2 model (`tiny:lumina2`) at 64 px, batch 2, AdamW, gradient clipping, the text encoder frozen, σ
drawn logit-normally (as the Lumina 2 presets train) and shifted by `timestep_shift`. The bare loop takes
`Lumina2Pipeline`'s components and caches in memory up front the VAE's latents of each image (shifted and scaled as
the pipeline decodes them) and each caption's own tokens of `encode_prompt` (after its system prompt). Each step pads
the batch's captions to the longest with their mask, draws the noise and σ (`family_overhead.sample_sigmas`), mixes
x_t = (1 − σ)·x0 + σ·ε, calls the transformer at Lumina's time 1 − σ, and trains its negated output against the
velocity ε − x0 with MSE, as the pipeline reads the output. The driver and its timing: `family_overhead.py`.
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
MODEL = "tiny:lumina2"


def lumina2_config(workdir: Path, device: torch.device):
    return comparable_lora_config(
        workdir,
        device,
        "Lumina 2",
        {
            "model_type": "LUMINA_2",
            "base_model_name": MODEL,
            "resolution": str(RESOLUTION),
            "layer_filter_preset": "attn-mlp",
            "timestep_distribution": "LOGIT_NORMAL",  # the Lumina 2 presets'
            "transformer": {"gradient_checkpointing": False},
        },
    )


def _padded(states: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    longest = max(len(s) for s in states)
    hidden = torch.stack([torch.cat([s, s.new_zeros(longest - len(s), *s.shape[1:])]) for s in states])
    mask = torch.stack([(torch.arange(longest, device=hidden.device) < len(s)).long() for s in states])
    return hidden, mask


class Lumina2BareLoop(BareLoop):
    def __init__(self, config, device: torch.device) -> None:
        super().__init__(config, device)
        self.pipe, self.transformer, self.params, self.optimizer = bare_pipeline_lora("Lumina2Pipeline", config, device)
        self.num_train_timesteps = int(self.pipe.scheduler.config.num_train_timesteps)

    def encode_image(self, pixels: torch.Tensor) -> torch.Tensor:
        vae = self.pipe.vae
        z = vae.encode(pixels[None]).latent_dist.mode()[0]
        return (z - vae.config.shift_factor) * vae.config.scaling_factor

    def encode_caption(self, caption: str):
        hidden, mask, _, _ = self.pipe.encode_prompt(caption, do_classifier_free_guidance=False, device=self.device)
        return hidden[0][mask[0].bool()]

    def cached(self) -> None:
        self.pipe = None

    def loss(self, latents: torch.Tensor, texts: list) -> torch.Tensor:
        hidden, mask = _padded(texts)
        noise = torch.randn_like(latents)
        sigmas = sample_sigmas(len(latents), self.config, self.num_train_timesteps, self.device)
        s = sigmas.view(-1, 1, 1, 1)
        output = self.transformer(
            hidden_states=(1.0 - s) * latents + s * noise,
            timestep=1.0 - sigmas,
            encoder_hidden_states=hidden,
            encoder_attention_mask=mask,
            return_dict=False,
        )[0]
        return torch.nn.functional.mse_loss(-output.float(), (noise - latents).float())


OVERHEAD = FamilyOverhead(
    part="lumina2",
    label="tiny Lumina 2",
    help="the same on tiny Lumina 2: Gemma-2's second-to-last states after the system prompt (each caption's own "
    "tokens), Flux's VAE latents, Lumina's time 1 - sigma and negated output",
    config=lumina2_config,
    bare=Lumina2BareLoop,
    resolution=RESOLUTION,
    check_trained=True,
)
