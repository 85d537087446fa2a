"""Flux.2's transformer between diffusers' names and Black Forest Labs' checkpoint layout (the `flux2` repository's
names, which BFL's own files, ComfyUI's Load Diffusion Model and diffusers' `from_single_file` use).

BFL's layout differs from diffusers' in names and in two fusions:

- the double-stream blocks' attention projections are one `img_attn.qkv` (diffusers' `attn.to_q|to_k|to_v`, rows
  q|k|v) and one `txt_attn.qkv` (`attn.add_q_proj|add_k_proj|add_v_proj`); the single-stream blocks are fused alike
  in both (`linear1` is `attn.to_qkv_mlp_proj`, `linear2` `attn.to_out`);
- the query / key norms' weights are `…norm.query_norm.scale` / `…norm.key_norm.scale`;
- the output modulation `final_layer.adaLN_modulation.1` holds (shift, scale) where diffusers' `norm_out.linear`
  holds (scale, shift): its two halves swap (the swap is its own inverse);
- the embedders and modulations: `img_in` (x_embedder), `txt_in` (context_embedder), `time_in.in_layer / out_layer`
  (time_guidance_embed.timestep_embedder.linear_1 / 2), `guidance_in.…` ([dev]'s guidance_embedder),
  `double_stream_modulation_img.lin`, `double_stream_modulation_txt.lin`, `single_stream_modulation.lin`,
  `final_layer.linear` (proj_out).

Every Flux.2 linear layer is without bias, so the maps carry weights (and a `.bias` the same way where one exists).
A file in either layout may carry ComfyUI's `model.diffusion_model.` prefix or `diffusion_model.`.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import torch

from onetrainer.weights.checkpoint_files import without_prefix
from onetrainer.weights.fused_lora import OriginalModule

# Top-level modules: diffusers' name → BFL's (whole module paths at the start of a key).
_TOP_LEVEL = (
    ("x_embedder", "img_in"),
    ("context_embedder", "txt_in"),
    ("time_guidance_embed.timestep_embedder.linear_1", "time_in.in_layer"),
    ("time_guidance_embed.timestep_embedder.linear_2", "time_in.out_layer"),
    ("time_guidance_embed.guidance_embedder.linear_1", "guidance_in.in_layer"),
    ("time_guidance_embed.guidance_embedder.linear_2", "guidance_in.out_layer"),
    ("double_stream_modulation_img.linear", "double_stream_modulation_img.lin"),
    ("double_stream_modulation_txt.linear", "double_stream_modulation_txt.lin"),
    ("single_stream_modulation.linear", "single_stream_modulation.lin"),
    ("proj_out", "final_layer.linear"),
    ("norm_out.linear", "final_layer.adaLN_modulation.1"),  # halves swapped
)
_SWAPPED = "norm_out.linear"
# Inside a double-stream block (`transformer_blocks.N.` ↔ `double_blocks.N.`), weights' and scales' full names.
_DOUBLE = (
    ("attn.norm_q.weight", "img_attn.norm.query_norm.scale"),
    ("attn.norm_k.weight", "img_attn.norm.key_norm.scale"),
    ("attn.norm_added_q.weight", "txt_attn.norm.query_norm.scale"),
    ("attn.norm_added_k.weight", "txt_attn.norm.key_norm.scale"),
    ("attn.to_out.0", "img_attn.proj"),
    ("attn.to_add_out", "txt_attn.proj"),
    ("ff.linear_in", "img_mlp.0"),
    ("ff.linear_out", "img_mlp.2"),
    ("ff_context.linear_in", "txt_mlp.0"),
    ("ff_context.linear_out", "txt_mlp.2"),
)
# The fused projections of a double-stream block: BFL's module ← diffusers' three (rows in this order).
FUSED = {
    "img_attn.qkv": ("attn.to_q", "attn.to_k", "attn.to_v"),
    "txt_attn.qkv": ("attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"),
}
# Inside a single-stream block (`single_transformer_blocks.N.` ↔ `single_blocks.N.`).
_SINGLE = (
    ("attn.norm_q.weight", "norm.query_norm.scale"),
    ("attn.norm_k.weight", "norm.key_norm.scale"),
    ("attn.to_qkv_mlp_proj", "linear1"),
    ("attn.to_out", "linear2"),
)
_BLOCKS = (
    ("transformer_blocks.", "double_blocks.", _DOUBLE),
    ("single_transformer_blocks.", "single_blocks.", _SINGLE),
)


def _swap_halves(value: torch.Tensor) -> torch.Tensor:
    first, second = value.chunk(2, dim=0)
    return torch.cat([second, first], dim=0)


def _rename(rest: str, table: tuple[tuple[str, str], ...], forward: bool) -> str | None:
    """`rest` (a key inside a module) renamed by the first entry of `table` it starts with (an entry is a whole name or
    a module followed by `.`); None when none fits."""
    for ours, theirs in table:
        source, target = (ours, theirs) if forward else (theirs, ours)
        if rest == source:
            return target
        if rest.startswith(source + "."):
            return target + rest[len(source) :]
    return None


def module_to_original(path: str) -> str | None:
    """A diffusers module path of the transformer in BFL's names; None for one of the fused projections (`FUSED`) or
    a module BFL's layout does not have."""
    for ours, theirs, table in _BLOCKS:
        if path.startswith(ours):
            index, _, rest = path[len(ours) :].partition(".")
            renamed = _rename(rest, table, forward=True)
            return None if renamed is None else f"{theirs}{index}.{renamed}"
    return _rename(path, _TOP_LEVEL, forward=True)


def to_original(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A `Flux2Transformer2DModel` state dict in BFL's layout; ValueError for a key it has no name for, or a block
    with only some of a fused projection's parts."""
    out: dict[str, torch.Tensor] = {}
    fused: dict[tuple[str, str], dict[str, torch.Tensor]] = {}  # (key, its fused module) → its parts
    for key, value in state.items():
        if key.startswith("transformer_blocks."):
            index, _, rest = key[len("transformer_blocks.") :].partition(".")
            module, _, leaf = rest.rpartition(".")
            target = next((t for t, parts in FUSED.items() if module in parts), None)
            if target is not None:
                fused.setdefault((f"double_blocks.{index}.{target}.{leaf}", target), {})[module] = value
                continue
        renamed = module_to_original(key)
        if renamed is None:
            raise ValueError(f"{key} has no name in Black Forest Labs' Flux.2 layout")
        out[renamed] = _swap_halves(value) if key.startswith(_SWAPPED + ".") else value
    for (key, target), parts in fused.items():
        names = FUSED[target]
        if set(parts) != set(names):
            raise ValueError(f"{key}: only {', '.join(sorted(parts))} of {', '.join(names)} are there")
        out[key] = torch.cat([parts[n] for n in names], dim=0)
    return out


def is_original(state: Mapping[str, torch.Tensor]) -> bool:
    """Whether a (prefix-free) state dict is in BFL's layout rather than diffusers'."""
    return any(k.startswith(("double_blocks.", "single_blocks.", "img_in.", "final_layer.")) for k in state)


def to_diffusers(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A transformer file in either layout (a `model.diffusion_model.` or `diffusion_model.` prefix allowed) in
    diffusers' names; ValueError for a key of BFL's layout it has no name for."""
    plain = without_prefix(state)
    if not is_original(plain):
        return plain
    out: dict[str, torch.Tensor] = {}
    for key, value in plain.items():
        renamed = None
        for ours, theirs, table in _BLOCKS:
            if key.startswith(theirs):
                index, _, rest = key[len(theirs) :].partition(".")
                module, _, leaf = rest.rpartition(".")
                if ours == "transformer_blocks." and module in FUSED:
                    if value.shape[0] % 3:
                        raise ValueError(f"{key} has {value.shape[0]} rows, not q|k|v of equal size")
                    for name, rows in zip(FUSED[module], value.chunk(3, dim=0)):
                        out[f"{ours}{index}.{name}.{leaf}"] = rows
                    renamed = ""
                else:
                    inner = _rename(rest, table, forward=False)
                    renamed = None if inner is None else f"{ours}{index}.{inner}"
                break
        else:
            renamed = _rename(key, _TOP_LEVEL, forward=False)
        if renamed is None:
            raise ValueError(f"{key} is not a weight of Black Forest Labs' Flux.2 transformer")
        if renamed:
            out[renamed] = _swap_halves(value) if renamed.startswith(_SWAPPED + ".") else value
    return out


def module_map(config: Mapping[str, Any]) -> dict[str, OriginalModule]:
    """Every linear module of a Flux.2 transformer (diffusers path) → where its output rows live in BFL's layout (a
    double block's q/k/v as thirds of `img_attn.qkv` / `txt_attn.qkv`; `norm_out.linear` with its halves swapped), for
    a diffusers config (`dict(transformer.config)` will do): the kohya LoRA layout's map (`flux2_lora.py`)."""
    return dict(
        _module_map(
            int(config["num_attention_heads"]) * int(config["attention_head_dim"]),
            int(config["num_layers"]),
            int(config["num_single_layers"]),
            bool(config.get("guidance_embeds")),
        )
    )


def original_module(module_path: str, config: Mapping[str, Any]) -> OriginalModule | None:
    """Where one diffusers module lives (`module_map`), None for one without a linear weight; a cached lookup."""
    return module_map(config).get(module_path)


@functools.lru_cache(maxsize=16)
def _module_map(inner: int, num_layers: int, num_single_layers: int, guidance: bool) -> dict[str, OriginalModule]:
    modules: dict[str, OriginalModule] = {}
    for ours, theirs in _TOP_LEVEL:
        if "guidance_embedder" in ours and not guidance:
            continue
        modules[ours] = OriginalModule(theirs, swapped=ours == _SWAPPED)
    qkv = (inner, inner, inner)
    for i in range(num_layers):
        for target, names in FUSED.items():
            for index, name in enumerate(names):
                modules[f"transformer_blocks.{i}.{name}"] = OriginalModule(f"double_blocks.{i}.{target}", index, qkv)
        for ours, theirs in _DOUBLE:
            if not ours.endswith(".weight"):  # a module, not a norm's scale
                modules[f"transformer_blocks.{i}.{ours}"] = OriginalModule(f"double_blocks.{i}.{theirs}")
    for i in range(num_single_layers):
        for ours, theirs in _SINGLE:
            if not ours.endswith(".weight"):
                modules[f"single_transformer_blocks.{i}.{ours}"] = OriginalModule(f"single_blocks.{i}.{theirs}")
    return modules
