"""What the trainer adds per step on Stable Cascade: `run_training` against a bare diffusers + peft loop doing the same
maths.

Both train a LoRA on every linear layer of the tiny Stable Cascade prior (`tiny:cascade`, stage C at the real depth)
at 128 px, batch 2, AdamW, gradient clipping, the text encoder frozen, the loss weighted with P2 (γ = 1). The bare
loop caches the EfficientNet latents and CLIP outputs (last hidden state, pooled text embedding) in memory up front;
each step draws noise and a uniform time, remaps it as Cascade does (t + 0.001), noises with the continuous cosine
schedule written out here, and trains the prior's noise prediction. The effnet is this trainer's own module (no
library has one). The driver and its timing: `family_overhead.py`.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from onetrainer.benchmark.family_overhead import BareLoop, FamilyOverhead, lora_config

RESOLUTION = 128
COSINE_S = 0.008


def cascade_config(workdir: Path, device: torch.device):
    return lora_config(
        workdir,
        device,
        "Cascade",
        {
            "model_type": "STABLE_CASCADE_1",
            "base_model_name": "tiny:cascade",
            "resolution": str(RESOLUTION),
            "layer_filter_preset": "full",
            "loss_weight_fn": "P2",
            "loss_weight_strength": 1.0,
            "prior": {"gradient_checkpointing": False, "weight_dtype": "FLOAT_32"},
        },
    )


def _alpha_bar(t: torch.Tensor) -> torch.Tensor:
    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.cos((x + COSINE_S) / (1 + COSINE_S) * math.pi / 2) ** 2

    return (f(t) / f(torch.zeros_like(t))).clamp(1e-4, 0.9999)


class CascadeBareLoop(BareLoop):
    def __init__(self, config, device: torch.device) -> None:
        from diffusers import StableCascadeUNet
        from peft import LoraConfig, inject_adapter_in_model
        from transformers import CLIPTextModelWithProjection, CLIPTokenizer

        from onetrainer.benchmark.overhead import lora_targets
        from onetrainer.tiny.effnet import build_effnet_encoder
        from onetrainer.tiny.source import resolve_local

        super().__init__(config, device)
        model_dir = str(resolve_local(config.base_model_name))
        self.prior = StableCascadeUNet.from_pretrained(model_dir, subfolder="prior", local_files_only=True)
        self.text_encoder = CLIPTextModelWithProjection.from_pretrained(
            model_dir, subfolder="text_encoder", local_files_only=True
        )
        self.tokenizer = CLIPTokenizer.from_pretrained(model_dir, subfolder="tokenizer", local_files_only=True)
        self.encoder = build_effnet_encoder(wuerstchen=False)
        for module in (self.prior, self.text_encoder, self.encoder):
            module.requires_grad_(False)
            module.to(device)
        # peft cannot put a rank-r LoRA on the prior's depthwise convolutions (our family leaves them out too).
        modules = dict(self.prior.named_modules())
        targets = [n for n in lora_targets(self.prior, config) if getattr(modules[n], "groups", 1) == 1]
        lora = LoraConfig(r=config.lora_rank, lora_alpha=config.lora_alpha, target_modules=targets)
        inject_adapter_in_model(lora, self.prior)
        self.params = [p for p in self.prior.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            self.params, lr=config.learning_rate, betas=(0.9, 0.999), weight_decay=1e-2, eps=1e-8
        )
        self.prior.train()
        self.clip_img = torch.zeros(config.batch_size, 1, self.prior.config.clip_image_in_channels, device=device)

    def encode_image(self, pixels: torch.Tensor) -> torch.Tensor:
        from onetrainer.families import effnet

        return self.encoder(effnet.preprocess(((pixels + 1) / 2)[None]))[0]

    def encode_caption(self, caption: str):
        tokens = self.tokenizer([caption], padding="max_length", max_length=77, truncation=True, return_tensors="pt")
        mask = tokens.attention_mask.to(self.device)
        out = self.text_encoder(tokens.input_ids.to(self.device), attention_mask=mask, output_hidden_states=True)
        return out.hidden_states[-1][0], out.text_embeds[0]

    def loss(self, latents: torch.Tensor, texts: list) -> torch.Tensor:
        hidden = torch.stack([t[0] for t in texts])
        pooled = torch.stack([t[1] for t in texts])[:, None]
        noise = torch.randn_like(latents)
        t = (torch.rand(self.config.batch_size, device=self.device) + 0.001).clamp(0.001, 1.0)
        alpha_bar = _alpha_bar(t).view(-1, 1, 1, 1)
        noisy = alpha_bar.sqrt() * latents + (1 - alpha_bar).sqrt() * noise
        predicted = self.prior(noisy, t, clip_text_pooled=pooled, clip_text=hidden, clip_img=self.clip_img).sample
        per_sample = (predicted.float() - noise.float()).pow(2).mean(dim=(1, 2, 3))
        snr = alpha_bar.flatten() / (1 - alpha_bar.flatten())
        return (per_sample / (1 + snr) ** self.config.loss_weight_strength).mean()


OVERHEAD = FamilyOverhead(
    part="cascade",
    label="the tiny Stable Cascade prior",
    help="the same on the tiny Stable Cascade prior: effnet latents, CLIP hidden + pooled, the cosine schedule with "
    "P2 weighting",
    config=cascade_config,
    bare=CascadeBareLoop,
    resolution=RESOLUTION,
)
