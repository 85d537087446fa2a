"""The template family's overhead benchmark part (`scripts/benchmark.py --part tiny-dit`, once registered), as a
built-in family's is its `onetrainer/benchmark/<key>_overhead.py`: the config it trains and the bare torch + peft loop
it is compared with; the driver (`benchmark/family_overhead.py`) does the rest. `register` adds it at test time, with
no shared file edited.

The bare loop does the family's maths by hand: latents and the masked T5 outputs cached up front, then a time drawn
uniformly, remapped as the family does, noised on the cosine schedule, and the DiT's noise prediction trained by MSE.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from onetrainer.benchmark.family_overhead import BareLoop, FamilyOverhead, lora_config, register_overhead
from onetrainer.noise.cosine import alpha_bar
from tests.families.tiny_dit_family import (
    BASE_MODEL,
    DIT,
    MODEL_TYPE,
    PATCH_AUTOENCODER,
    TOKENS,
    WEIGHTS_FILE,
    build_parts,
    cascade_remap,
)

PART = "tiny-dit"
RESOLUTION = 64


def tiny_dit_config(workdir: Path, device: torch.device):
    settings = {"model_type": MODEL_TYPE.value, "base_model_name": BASE_MODEL, "resolution": str(RESOLUTION)}
    settings["output_model_format"] = "KOHYA_LORA"  # its only LoRA format
    return lora_config(workdir, device, "tiny DiT", {**settings, "layer_filter_preset": "attn-only"})


class TinyDiTBareLoop(BareLoop):
    def __init__(self, config, device: torch.device) -> None:
        from peft import LoraConfig, inject_adapter_in_model
        from safetensors.torch import load_file

        from onetrainer.benchmark.overhead import lora_targets
        from onetrainer.families.sources import resolve_local

        super().__init__(config, device)
        parts, self.tokenizer = build_parts()
        state = load_file(resolve_local(config.base_model_name) / WEIGHTS_FILE)
        for name, module in parts.items():
            module.load_state_dict({k[len(name) + 1 :]: v for k, v in state.items() if k.startswith(name + ".")})
            module.requires_grad_(False).to(device)
        self.dit, self.t5, self.autoencoder = parts[DIT], parts["text_encoder"], parts[PATCH_AUTOENCODER]
        targets = lora_targets(self.dit, config)
        lora = LoraConfig(r=config.lora_rank, lora_alpha=config.lora_alpha, target_modules=targets)
        inject_adapter_in_model(lora, self.dit)
        self.params = [p for p in self.dit.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=config.learning_rate, weight_decay=1e-2)
        self.dit.train()

    def encode_image(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.autoencoder.encode(pixels[None])[0]

    def encode_caption(self, caption: str):
        tokens = self.tokenizer(
            [caption], padding="max_length", max_length=TOKENS, truncation=True, return_tensors="pt"
        )
        mask = tokens.attention_mask.to(self.device)
        return self.t5(tokens.input_ids.to(self.device), attention_mask=mask).last_hidden_state[0], mask[0]

    def cached(self) -> None:
        self.t5 = None

    def loss(self, latents: torch.Tensor, texts: list) -> torch.Tensor:
        hidden = torch.stack([t[0] for t in texts])
        mask = torch.stack([t[1] for t in texts])
        noise = torch.randn_like(latents)
        times = cascade_remap(torch.rand(len(latents), device=self.device))
        a = alpha_bar(times).view(-1, 1, 1, 1)
        noisy = a.sqrt() * latents + (1 - a).sqrt() * noise
        return torch.nn.functional.mse_loss(self.dit(noisy, times, hidden, mask), noise)


OVERHEAD = FamilyOverhead(
    part=PART,
    label="the template family's tiny DiT",
    help="the comparison on the template family of the tests (registered at test time)",
    config=tiny_dit_config,
    bare=TinyDiTBareLoop,
    resolution=RESOLUTION,
    check_trained=True,
)


def register() -> Callable[[], None]:
    """Make `--part tiny-dit` known. Returns the undo."""
    return register_overhead(OVERHEAD)
