"""Stable Cascade stage C LoRA names: OneTrainer's LEGACY_LORA and KOHYA_LORA layouts, from diffusers module paths.

Both name a module by its *native* path (the Stability / ComfyUI model) with dots turned into underscores. Native
paths equal diffusers' except in attention: ComfyUI splits Stability's fused `attention.attn.in_proj` into
`attention.attn.to_q/to_k/to_v` when it loads stage C, and keeps `attention.attn.out_proj`, so diffusers'
`attention.to_q` is native `attention.attn.to_q` and `attention.to_out.0` is `attention.attn.out_proj`.

- LEGACY_LORA (what ComfyUI maps for stage C specifically): `lora_prior_unet_<native>`, text encoder
  `lora_prior_te_<text_model…>`.
- KOHYA_LORA: `lora_unet_<native>` and `lora_te_<text_model…>`, which ComfyUI's generic map takes for any model.

The text encoder's names are transformers' module paths (`text_model.encoder.layers.0.self_attn.q_proj`).
Grouped and depthwise convolutions never get a LoRA (`adaptable_modules`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from torch import nn

LEGACY_PRIOR_PREFIX = "lora_prior_unet"
LEGACY_TEXT_PREFIX = "lora_prior_te"
KOHYA_PRIOR_PREFIX = "lora_unet"
KOHYA_TEXT_PREFIX = "lora_te"

_TO_NATIVE = (
    (re.compile(r"\.attention\.(to_[qkv])$"), r".attention.attn.\1"),
    (re.compile(r"\.attention\.to_out\.0$"), ".attention.attn.out_proj"),
)
_TO_DIFFUSERS = (
    (re.compile(r"\.attention\.attn\.(to_[qkv])$"), r".attention.\1"),
    (re.compile(r"\.attention\.attn\.out_proj$"), ".attention.to_out.0"),
)


def native_module_path(diffusers_path: str) -> str:
    """A StableCascadeUNet module path → the module's path in ComfyUI's stage C (split attention)."""
    return _substitute(_TO_NATIVE, diffusers_path)


def diffusers_module_path(native_path: str) -> str:
    return _substitute(_TO_DIFFUSERS, native_path)


def _substitute(rules: tuple[tuple[re.Pattern[str], str], ...], path: str) -> str:
    for pattern, replacement in rules:
        path, count = pattern.subn(replacement, path)
        if count:
            break
    return path


def prior_lora_name(diffusers_path: str, legacy: bool) -> str:
    """`down_blocks.0.2.attention.to_q` → `lora_prior_unet_down_blocks_0_2_attention_attn_to_q` (legacy) or
    `lora_unet_down_blocks_0_2_attention_attn_to_q`."""
    prefix = LEGACY_PRIOR_PREFIX if legacy else KOHYA_PRIOR_PREFIX
    return f"{prefix}_{native_module_path(diffusers_path).replace('.', '_')}"


def text_encoder_lora_name(module_path: str, legacy: bool) -> str:
    """`text_model.encoder.layers.3.mlp.fc1` → `lora_prior_te_text_model_encoder_layers_3_mlp_fc1` (legacy) or
    `lora_te_text_model_encoder_layers_3_mlp_fc1`."""
    prefix = LEGACY_TEXT_PREFIX if legacy else KOHYA_TEXT_PREFIX
    return f"{prefix}_{module_path.replace('.', '_')}"


def adaptable_modules(model: nn.Module) -> list[str]:
    """Paths of the modules a LoRA may adapt: Linear layers and ungrouped convolutions."""
    return [
        name
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear) or (isinstance(module, nn.Conv2d) and module.groups == 1)
    ]


def lora_name_map(module_paths: Iterable[str], name_of: Callable[[str], str]) -> dict[str, str]:
    """LoRA name → module path, for reading a file back; refuses two modules that would share a name."""
    names: dict[str, str] = {}
    for path in module_paths:
        name = name_of(path)
        if name in names:
            raise ValueError(f"modules {names[name]} and {path} would both be saved as {name}")
        names[name] = path
    return names
