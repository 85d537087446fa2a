"""PixArt LoRA weights between peft (diffusers module names) and kohya's layout over PixArt's native names.

Kohya names are `lora_unet_<native module path>` for the transformer (the names ComfyUI maps for PixArt) and
`lora_te1_<module path>` for T5. Natively, self-attention's q/k/v are one `attn.qkv` layer and cross-attention's k/v
one `cross_attn.kv_linear`, so separate adapters on to_q/to_k/to_v (to_k/to_v) are written as one LoRA on the fused
layer: its down matrix stacks the adapters' down matrices, its up matrix is block-diagonal (adapter i writes only
its own output rows). A consumer adds (alpha / rank) · up · down; with equal alpha / rank for the parts, alpha is
their sum and rank the sum of ranks (3 adapters of rank r, alpha a → rank 3r, alpha 3a), otherwise each part's
scale is folded into its up block and alpha = rank. Either way the fused ΔW is exactly the parts' ΔW stacked.

Importing reverses this where the fused LoRA is block-diagonal (ours, or any with that structure); a LoRA trained on
the fused layer itself mixes the projections and is not split here: that is an error. `fused_lora.py` does both
directions (also for Flux).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch

from onetrainer.weights import kohya_lora, lycoris_keys
from onetrainer.weights.fused_lora import fuse, peft_pairs, split
from onetrainer.weights.kohya_lora import LORA_A, LORA_B
from onetrainer.weights.pixart_keys import NativeModule, module_map

TRANSFORMER_PREFIX = "lora_unet"
TEXT_ENCODER_PREFIX = "lora_te1"

LoraParts = tuple[dict[str, torch.Tensor], dict[str, float], dict[str, int], list[str]]


def transformer_kohya_name(native_path: str) -> str:
    return kohya_lora.kohya_module_name(TRANSFORMER_PREFIX, native_path)


def text_encoder_kohya_name(module_path: str) -> str:
    return kohya_lora.kohya_module_name(TEXT_ENCODER_PREFIX, module_path)


def transformer_to_kohya(
    state_dict: Mapping[str, torch.Tensor], alphas: Mapping[str, float] | float, config: Mapping[str, Any]
) -> dict[str, torch.Tensor]:
    """peft LoRA weights of the transformer (`<diffusers module>.lora_A.weight` / `.lora_B.weight`) → kohya keys
    over the native names, q/k/v and k/v fused. `alphas`: one alpha, or one per diffusers module path."""
    natives = module_map(config)
    groups: dict[str, dict[int, tuple[torch.Tensor, torch.Tensor, float]]] = {}
    parts_of: dict[str, int] = {}
    for module, (down, up) in peft_pairs(state_dict).items():
        native = natives.get(module)
        if native is None:
            raise KeyError(f"no native PixArt module for the LoRA on {module}")
        alpha = float(alphas if isinstance(alphas, int | float) else alphas[module])
        groups.setdefault(native.path, {})[native.index] = (down, up, alpha)
        parts_of[native.path] = native.parts

    out: dict[str, torch.Tensor] = {}
    for path, adapters in groups.items():
        rows = [adapters[min(adapters)][1].shape[0]] * parts_of[path]  # PixArt's fused slices are equal
        down, up, alpha = fuse(adapters, rows)
        name = transformer_kohya_name(path)
        out[f"{name}.lora_down.weight"] = down
        out[f"{name}.lora_up.weight"] = up
        out[f"{name}.alpha"] = torch.tensor(alpha)
    return out


def kohya_to_transformer(state_dict: Mapping[str, torch.Tensor], config: Mapping[str, Any]) -> LoraParts:
    """kohya `lora_unet_…` keys → (peft weights by diffusers module, alpha per module, rank per module, kohya names
    this transformer does not have). Fused q/k/v and k/v LoRAs are split where block-diagonal, else ValueError."""
    by_path: dict[str, list[tuple[str, NativeModule]]] = {}
    for module, native in module_map(config).items():
        by_path.setdefault(native.path, []).append((module, native))
    by_name = {transformer_kohya_name(path): modules for path, modules in by_path.items()}

    downs, ups, alphas, unknown = _read_kohya(state_dict, by_name)
    weights: dict[str, torch.Tensor] = {}
    module_alphas: dict[str, float] = {}
    ranks: dict[str, int] = {}
    for name, down in downs.items():
        if name not in ups:
            raise ValueError(f"{name} has lora_down but no lora_up")
        up, rank = ups[name], down.shape[0]
        alpha = alphas.get(name, float(rank))  # kohya's convention: no alpha means alpha = rank
        modules = sorted(by_name[name], key=lambda item: item[1].index)
        if len(modules) == 1:
            slices: list = [(down, up, alpha)]
        else:
            if up.shape[0] % len(modules):
                raise ValueError(
                    f"{name}: lora_up has {up.shape[0]} rows, not divisible into {len(modules)} projections"
                )
            slices = split(name, down, up, alpha, [up.shape[0] // len(modules)] * len(modules))
        for (module, _), part in zip(modules, slices):
            if part is None:
                continue  # this projection had no adapter
            part_down, part_up, part_alpha = part
            weights[module + LORA_A] = part_down
            weights[module + LORA_B] = part_up
            module_alphas[module] = part_alpha
            ranks[module] = int(part_down.shape[0])
    return weights, module_alphas, ranks, unknown


def text_encoder_to_kohya(
    state_dict: Mapping[str, torch.Tensor], alphas: Mapping[str, float] | float
) -> dict[str, torch.Tensor]:
    """peft LoRA weights of T5 (module paths of `T5EncoderModel`) → `lora_te1_…` keys."""
    ranks = {k[: -len(LORA_A)]: int(v.shape[0]) for k, v in state_dict.items() if k.endswith(LORA_A)}
    per_module = alphas if isinstance(alphas, Mapping) else dict.fromkeys(ranks, float(alphas))
    return lycoris_keys.to_kohya(lycoris_keys.LORA, state_dict, text_encoder_kohya_name, per_module, ranks)


def kohya_to_text_encoder(state_dict: Mapping[str, torch.Tensor], module_paths: Iterable[str]) -> LoraParts:
    """`lora_te1_…` keys → peft weights of T5; `module_paths` are the encoder's module names (underscores alone are
    ambiguous, so names are matched against the real modules)."""
    module_of = {text_encoder_kohya_name(path): path for path in module_paths}
    weights, alphas, ranks, _, unknown = lycoris_keys.from_kohya(lycoris_keys.LORA, state_dict, module_of)
    return weights, alphas, ranks, unknown


def _read_kohya(
    state_dict: Mapping[str, torch.Tensor], names: Mapping[str, Any]
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], dict[str, float], list[str]]:
    downs: dict[str, torch.Tensor] = {}
    ups: dict[str, torch.Tensor] = {}
    alphas: dict[str, float] = {}
    unknown: set[str] = set()
    for key, value in state_dict.items():
        name, _, suffix = key.partition(".")
        if name not in names:
            unknown.add(name)
        elif suffix == "lora_down.weight":
            downs[name] = value
        elif suffix == "lora_up.weight":
            ups[name] = value
        elif suffix == "alpha":
            alphas[name] = float(value.item())
        else:
            unknown.add(key)
    return downs, ups, alphas, sorted(unknown)
