"""PixArt's transformer between diffusers' names and PixArt's own checkpoint layout (`PixArt-XL-2-*.pth`).

diffusers converts original checkpoints only one way, in a script, and has no single-file loader for PixArt: both
directions are ours. The native layout fuses self-attention's q/k/v into `blocks.N.attn.qkv` and cross-attention's
k/v into `blocks.N.cross_attn.kv_linear` (rows stacked in that order). It also holds two tensors diffusers has no
parameter for: `pos_embed` (the fixed sin-cos position table, which diffusers recomputes) and
`y_embedder.y_embedding` (the learned "no caption" embedding PixArt's own training and sampling scripts use; tools
detect a PixArt checkpoint and its token count by it). The map is derived from the transformer config: its number of
layers, its width, and whether the resolution/aspect-ratio embedders exist (the 1024 models, `sample_size == 128`).
It is made of `fused_lora.OriginalModule`s, as Flux's and SD 3's maps are, so the one map converts checkpoints and
names LoRA modules alike (`pixart_lora.py`).
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Mapping
from typing import Any

import torch

from onetrainer.weights.checkpoint_files import load_state_dict
from onetrainer.weights.fused_lora import OriginalModule
from onetrainer.weights.key_check import check_keys

POS_EMBED = "pos_embed"
Y_EMBEDDING = "y_embedder.y_embedding"
NATIVE_ONLY = (POS_EMBED, Y_EMBEDDING)
# PixArt-Alpha's caption length (the row count of y_embedding); PixArt-Sigma's is 300.
ALPHA_CAPTION_TOKENS = 120

_PARAMETERS = ("weight", "bias")


def has_micro_conditions(config: Mapping[str, Any]) -> bool:
    """Whether the transformer has resolution and aspect-ratio embedders (diffusers' own rule for `None`)."""
    explicit = config.get("use_additional_conditions")
    if explicit is not None:
        return bool(explicit)
    return config["sample_size"] == 128


def module_map(config: Mapping[str, Any]) -> dict[str, OriginalModule]:
    """Every diffusers module with a weight and a bias → its native module (a slice of it where fused: q|k|v of
    `attn.qkv`, k|v of `cross_attn.kv_linear`, each the transformer's width)."""
    return dict(_module_map(*_topology(config)))


def original_module(module_path: str, config: Mapping[str, Any]) -> OriginalModule | None:
    """Where one diffusers module lives natively (`module_map`), None for a module without a weight and a bias; a
    lookup in a cached map, for naming modules one at a time."""
    return _module_map(*_topology(config)).get(module_path)


def _topology(config: Mapping[str, Any]) -> tuple[int, int, bool]:
    """What the map depends on, as a cache key: the blocks, the width of the fused slices, the micro-conditions."""
    width = int(config["num_attention_heads"]) * int(config["attention_head_dim"])
    return int(config["num_layers"]), width, has_micro_conditions(config)


@functools.lru_cache(maxsize=16)
def _module_map(layers: int, width: int, micro_conditions: bool) -> dict[str, OriginalModule]:
    modules = {
        "pos_embed.proj": OriginalModule("x_embedder.proj"),
        "caption_projection.linear_1": OriginalModule("y_embedder.y_proj.fc1"),
        "caption_projection.linear_2": OriginalModule("y_embedder.y_proj.fc2"),
        "adaln_single.emb.timestep_embedder.linear_1": OriginalModule("t_embedder.mlp.0"),
        "adaln_single.emb.timestep_embedder.linear_2": OriginalModule("t_embedder.mlp.2"),
        "adaln_single.linear": OriginalModule("t_block.1"),
        "proj_out": OriginalModule("final_layer.linear"),
    }
    if micro_conditions:
        for diffusers_name, native_name in (("resolution", "csize"), ("aspect_ratio", "ar")):
            for linear, index in (("linear_1", 0), ("linear_2", 2)):
                modules[f"adaln_single.emb.{diffusers_name}_embedder.{linear}"] = OriginalModule(
                    f"{native_name}_embedder.mlp.{index}"
                )
    qkv, kv = (width,) * 3, (width,) * 2
    for n in range(layers):
        block, native = f"transformer_blocks.{n}", f"blocks.{n}"
        for index, projection in enumerate(("to_q", "to_k", "to_v")):
            modules[f"{block}.attn1.{projection}"] = OriginalModule(f"{native}.attn.qkv", index, qkv)
        modules[f"{block}.attn1.to_out.0"] = OriginalModule(f"{native}.attn.proj")
        modules[f"{block}.attn2.to_q"] = OriginalModule(f"{native}.cross_attn.q_linear")
        for index, projection in enumerate(("to_k", "to_v")):
            modules[f"{block}.attn2.{projection}"] = OriginalModule(f"{native}.cross_attn.kv_linear", index, kv)
        modules[f"{block}.attn2.to_out.0"] = OriginalModule(f"{native}.cross_attn.proj")
        modules[f"{block}.ff.net.0.proj"] = OriginalModule(f"{native}.mlp.fc1")
        modules[f"{block}.ff.net.2"] = OriginalModule(f"{native}.mlp.fc2")
    return modules


def parameter_map(config: Mapping[str, Any]) -> dict[str, str]:
    """The bare parameters (not inside a Linear/Conv): diffusers key → native key."""
    params = {"scale_shift_table": "final_layer.scale_shift_table"}
    for n in range(config["num_layers"]):
        params[f"transformer_blocks.{n}.scale_shift_table"] = f"blocks.{n}.scale_shift_table"
    return params


def diffusers_keys(config: Mapping[str, Any]) -> set[str]:
    """The keys of a diffusers PixArt transformer's state dict."""
    keys = {f"{module}.{p}" for module in module_map(config) for p in _PARAMETERS}
    return keys | set(parameter_map(config))


def native_keys(config: Mapping[str, Any], with_native_only: bool = True) -> set[str]:
    """The keys of the native checkpoint, with or without `pos_embed` and `y_embedder.y_embedding`."""
    keys = {f"{m.path}.{p}" for m in module_map(config).values() for p in _PARAMETERS}
    keys |= set(parameter_map(config).values())
    return keys | set(NATIVE_ONLY) if with_native_only else keys


def native_pos_embed(config: Mapping[str, Any]) -> torch.Tensor:
    """The fixed 2-D sin-cos position table `(1, patches, width)` the native checkpoint stores, as diffusers builds it
    for the same config (grid and base size: sample_size / patch_size; interpolation scale as in diffusers)."""
    from diffusers.models.embeddings import get_2d_sincos_pos_embed

    grid = config["sample_size"] // config["patch_size"]
    scale = config.get("interpolation_scale")
    if scale is None:
        scale = max(config["sample_size"] // 64, 1)
    width = config["num_attention_heads"] * config["attention_head_dim"]
    table = get_2d_sincos_pos_embed(width, grid, base_size=grid, interpolation_scale=scale, output_type="pt")
    return table.float().unsqueeze(0)


def diffusers_to_native(
    state_dict: Mapping[str, torch.Tensor],
    config: Mapping[str, Any],
    y_embedding: torch.Tensor | None = None,
    caption_tokens: int = ALPHA_CAPTION_TOKENS,
) -> dict[str, torch.Tensor]:
    """A diffusers transformer state dict → the native layout, q/k/v and k/v fused, with `pos_embed` and
    `y_embedder.y_embedding`.

    `y_embedding` is the source checkpoint's own when it had one (`native_to_diffusers` returns it). Otherwise it is
    zeros `(caption_tokens, caption_channels)`: the "no caption" input our caption dropout trains (zero hidden states).
    """
    check_keys(state_dict, diffusers_keys(config), "diffusers PixArt transformer")
    out: dict[str, torch.Tensor] = {}
    fused: dict[str, list[torch.Tensor | None]] = {}
    for module, native in module_map(config).items():
        for p in _PARAMETERS:
            value = state_dict[f"{module}.{p}"]
            if not native.fused:
                out[f"{native.path}.{p}"] = value
            else:
                fused.setdefault(f"{native.path}.{p}", [None] * len(native.rows))[native.index] = value
    for key, slices in fused.items():
        out[key] = torch.cat(slices, dim=0)  # every slot is filled: check_keys saw every diffusers key
    for diffusers_key, native_key in parameter_map(config).items():
        out[native_key] = state_dict[diffusers_key]

    reference = state_dict["caption_projection.linear_1.weight"]
    out[POS_EMBED] = native_pos_embed(config).to(reference.dtype)
    if y_embedding is None:
        y_embedding = torch.zeros(caption_tokens, config["caption_channels"], dtype=reference.dtype)
    out[Y_EMBEDDING] = y_embedding
    return out


def native_to_diffusers(
    state_dict: Mapping[str, torch.Tensor], config: Mapping[str, Any]
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """A native state dict → (diffusers state dict with q/k/v split, the native-only tensors found).

    `pos_embed` and `y_embedder.y_embedding` may be absent (some repacks drop them); every other key must match the
    config exactly, or the error lists what is missing and what is left over.
    """
    extras = {k: state_dict[k] for k in NATIVE_ONLY if k in state_dict}
    weights = {k: v for k, v in state_dict.items() if k not in extras}
    check_keys(weights, native_keys(config, with_native_only=False), "native PixArt checkpoint")
    out: dict[str, torch.Tensor] = {}
    for module, native in module_map(config).items():
        for p in _PARAMETERS:
            value = weights[f"{native.path}.{p}"]
            if native.fused:
                parts = len(native.rows)
                if value.shape[0] % parts:
                    raise ValueError(
                        f"{native.path}.{p} has {value.shape[0]} rows, not divisible into {parts} projections"
                    )
                value = value.chunk(parts, dim=0)[native.index]
            out[f"{module}.{p}"] = value
    for diffusers_key, native_key in parameter_map(config).items():
        out[diffusers_key] = weights[native_key]
    return out, extras


def native_topology(state_dict: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    """What a native checkpoint says about its transformer config: `num_layers`, `patch_size`, `sample_size` (from
    `pos_embed`'s patch count, else 128 when it has the micro-conditioning embedders and 64 otherwise),
    `use_additional_conditions`, and `caption_tokens` (y_embedding's rows, 120 Alpha / 300 Sigma) when present."""
    if "x_embedder.proj.weight" not in state_dict:
        raise ValueError("not a native PixArt checkpoint: it has no x_embedder.proj.weight")
    layers = {int(key.split(".")[1]) for key in state_dict if key.startswith("blocks.")}
    patch = int(state_dict["x_embedder.proj.weight"].shape[-1])
    micro = "csize_embedder.mlp.0.weight" in state_dict
    topology: dict[str, Any] = {
        "num_layers": max(layers) + 1 if layers else 0,
        "patch_size": patch,
        "use_additional_conditions": micro,
        "sample_size": 128 if micro else 64,
    }
    if POS_EMBED in state_dict:
        topology["sample_size"] = math.isqrt(state_dict[POS_EMBED].shape[1]) * patch
    if Y_EMBEDDING in state_dict:
        topology["caption_tokens"] = int(state_dict[Y_EMBEDDING].shape[0])
    return topology


def read_native_checkpoint(
    path: str | os.PathLike, config: Mapping[str, Any], dtype: torch.dtype | None = None
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """An original PixArt file (`.pth` read with `weights_only`, its `state_dict` unwrapped, or `.safetensors`) →
    (a diffusers state dict for a transformer with `config`, its weights read in `dtype` (None: as stored); the
    native-only tensors, as the file stores them); errors name the file."""
    state_dict = load_state_dict(path, lambda key: None if key in NATIVE_ONLY else dtype)  # errors name the file
    try:
        return native_to_diffusers(state_dict, config)
    except (KeyError, ValueError) as error:
        raise ValueError(f"{os.fspath(path)}: {error}") from error
