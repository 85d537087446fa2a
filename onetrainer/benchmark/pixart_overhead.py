"""What the trainer adds per step on PixArt: `run_training` against a bare diffusers + peft loop doing the same maths.

Both train a LoRA (attention and MLP layers) on the tiny PixArt-Alpha 1024 model (`tiny:pixart`) at 64 px, batch 2,
AdamW, gradient clipping, T5 frozen. The bare loop caches latents and T5 outputs (hidden states and mask) in memory
up front, then each step draws noise and timesteps, runs the transformer with the bucket's resolution / aspect-ratio
conditions and the caption mask, and trains the noise half with MSE plus the variance half with IDDPM's variational
bound (`noise/variational_bound.py`, the noise detached), as our PixArt family does. The driver and its timing:
`family_overhead.py`.
"""

from __future__ import annotations

from pathlib import Path

import torch

from onetrainer.benchmark.family_overhead import BareLoop, FamilyOverhead, lora_config
from onetrainer.noise.variational_bound import split_learned_variance, variational_bound

RESOLUTION = 64


def pixart_config(workdir: Path, device: torch.device):
    return lora_config(
        workdir,
        device,
        "PixArt",
        {
            "model_type": "PIXART_ALPHA",
            "base_model_name": "tiny:pixart",
            "resolution": str(RESOLUTION),
            "layer_filter_preset": "attn-mlp",
            "transformer": {"gradient_checkpointing": False},
        },
    )


class PixArtBareLoop(BareLoop):
    def __init__(self, config, device: torch.device) -> None:
        from diffusers import DDPMScheduler, PixArtAlphaPipeline
        from peft import LoraConfig, inject_adapter_in_model

        from onetrainer.benchmark.overhead import lora_targets
        from onetrainer.tiny.source import resolve_local

        super().__init__(config, device)
        model_dir = str(resolve_local(config.base_model_name))
        pipe = PixArtAlphaPipeline.from_pretrained(model_dir, local_files_only=True)
        self.transformer, self.vae = pipe.transformer, pipe.vae
        self.t5, self.tokenizer = pipe.text_encoder, pipe.tokenizer
        self.scheduler = DDPMScheduler.from_pretrained(model_dir, subfolder="scheduler", local_files_only=True)
        del pipe
        for module in (self.transformer, self.vae, self.t5):
            module.requires_grad_(False)
            module.to(device)
        # PixArt's transformer has no diffusers adapter mixin: peft's injection, as our LoRA method does.
        targets = lora_targets(self.transformer, config)
        lora = LoraConfig(r=config.lora_rank, lora_alpha=config.lora_alpha, target_modules=targets)
        inject_adapter_in_model(lora, self.transformer)
        self.params = [p for p in self.transformer.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            self.params, lr=config.learning_rate, betas=(0.9, 0.999), weight_decay=1e-2, eps=1e-8
        )
        self.transformer.train()
        self.alphas_cumprod = self.scheduler.alphas_cumprod.to(device)
        self.betas = self.scheduler.betas.to(device)
        batch_size = config.batch_size
        self.added = {
            "resolution": torch.tensor([[float(RESOLUTION)] * 2] * batch_size, device=device),
            "aspect_ratio": torch.ones(batch_size, 1, device=device),
        }

    def encode_image(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.vae.encode(pixels[None]).latent_dist.mode()[0] * self.vae.config.scaling_factor

    def encode_caption(self, caption: str):
        tokens = self.tokenizer([caption], padding="max_length", max_length=120, truncation=True, return_tensors="pt")
        mask = tokens.attention_mask.to(self.device)
        return self.t5(tokens.input_ids.to(self.device), attention_mask=mask).last_hidden_state[0], mask[0]

    def loss(self, latents: torch.Tensor, texts: list) -> torch.Tensor:
        hidden = torch.stack([t[0] for t in texts])
        mask = torch.stack([t[1] for t in texts])
        noise = torch.randn_like(latents)
        timesteps = torch.randint(0, self.scheduler.config.num_train_timesteps, (len(latents),), device=self.device)
        noisy = self.scheduler.add_noise(latents, noise, timesteps)
        output = self.transformer(
            noisy, encoder_hidden_states=hidden, timestep=timesteps, added_cond_kwargs=self.added,
            encoder_attention_mask=mask,
        ).sample  # fmt: skip
        predicted, variance = split_learned_variance(output)
        vb = variational_bound(predicted, variance, latents, noisy, timesteps, self.alphas_cumprod, self.betas)
        return torch.nn.functional.mse_loss(predicted.float(), noise.float()) + vb.mean()


OVERHEAD = FamilyOverhead(
    part="pixart",
    label="tiny PixArt-Alpha",
    help="the same comparison on the tiny PixArt model: T5 mask, micro-conditions, the variance term",
    config=pixart_config,
    bare=PixArtBareLoop,
    resolution=RESOLUTION,
)
