"""Stable Diffusion 3 / 3.5 between diffusers' names and Stability AI's single-file layout (`sd3_medium.safetensors`,
`sd3.5_large.safetensors`), which ComfyUI, Forge and diffusers' `from_single_file` load.

The transformer lives under `model.diffusion_model.` as an MMDiT: `x_embedder`, `t_embedder`, `y_embedder`,
`context_embedder`, `pos_embed`, `joint_blocks.N.x_block` / `.context_block` (the image and text halves of each joint
block, their q/k/v fused in one `attn.qkv`, 3.5's RMS norms as `attn.ln_q` / `ln_k`, 3.5 Medium's second image
attention as `attn2`) and `final_layer`. The final layer's modulation and the last block's text modulation (that block's
text half ends early, so its modulation has two chunks) store shift|scale where diffusers stores scale|shift: their
rows are swapped. The VAE is `first_stage_model.` in LDM names; the text encoders, when the file holds them,
`text_encoders.clip_l.transformer.`, `text_encoders.clip_g.transformer.` and `text_encoders.t5xxl.transformer.` over
transformers' own names.

diffusers converts only the file → diffusers direction (`convert_sd3_transformer_checkpoint_to_diffusers`); this is the
other direction, written from the transformer config so it holds at any width. One map, `module_map`, places every
module with a weight (the Linear layers and the patch embedding's convolution) and also names the LoRA modules
(`sd3_lora.py`); the bare parameters (the position table, 3.5's RMS norm scales) are `parameter_map`'s.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import torch

from onetrainer.weights.fused_lora import OriginalModule, swap_halves

TRANSFORMER_PREFIX = "model.diffusion_model."
VAE_PREFIX = "first_stage_model."
TEXT_ENCODER_PREFIXES = {
    "text_encoder": "text_encoders.clip_l.transformer.",
    "text_encoder_2": "text_encoders.clip_g.transformer.",
    "text_encoder_3": "text_encoders.t5xxl.transformer.",
}


_PARAMETERS = ("weight", "bias")


def width(config: Mapping[str, Any]) -> int:
    return int(config["num_attention_heads"]) * int(config["attention_head_dim"])


def module_map(config: Mapping[str, Any]) -> dict[str, OriginalModule]:
    """Every module of an `SD3Transformer2DModel` with a weight (the Linear layers, `pos_embed.proj`'s convolution) →
    where it lives in SAI's layout, for a transformer config (`dict(transformer.config)` will do)."""
    return dict(_module_map(*_topology(config)))


def original_module(module_path: str, config: Mapping[str, Any]) -> OriginalModule | None:
    """Where one diffusers module lives (`module_map`), None for a module without a weight there; a lookup in a cached
    map, for naming modules one at a time."""
    return _module_map(*_topology(config)).get(module_path)


def _topology(config: Mapping[str, Any]) -> tuple[int, int, tuple[int, ...]]:
    """What the map depends on, as a cache key: the blocks, the width of the fused q/k/v, the blocks with 3.5 Medium's
    second image attention."""
    dual = tuple(sorted(int(i) for i in config.get("dual_attention_layers") or ()))
    return int(config["num_layers"]), width(config), dual


@functools.lru_cache(maxsize=16)
def _module_map(layers: int, inner: int, dual_attention_layers: tuple[int, ...]) -> dict[str, OriginalModule]:
    qkv = (inner, inner, inner)
    modules = {
        "pos_embed.proj": OriginalModule("x_embedder.proj"),
        "time_text_embed.timestep_embedder.linear_1": OriginalModule("t_embedder.mlp.0"),
        "time_text_embed.timestep_embedder.linear_2": OriginalModule("t_embedder.mlp.2"),
        "time_text_embed.text_embedder.linear_1": OriginalModule("y_embedder.mlp.0"),
        "time_text_embed.text_embedder.linear_2": OriginalModule("y_embedder.mlp.2"),
        "context_embedder": OriginalModule("context_embedder"),
        "proj_out": OriginalModule("final_layer.linear"),
        "norm_out.linear": OriginalModule("final_layer.adaLN_modulation.1", swapped=True),
    }
    for i in range(layers):
        ours, theirs = f"transformer_blocks.{i}", f"joint_blocks.{i}"
        image, text = f"{theirs}.x_block", f"{theirs}.context_block"
        last = i == layers - 1  # its text half ends after the attention: no output projection, no MLP
        for index, p in enumerate("qkv"):
            modules[f"{ours}.attn.to_{p}"] = OriginalModule(f"{image}.attn.qkv", index, qkv)
            modules[f"{ours}.attn.add_{p}_proj"] = OriginalModule(f"{text}.attn.qkv", index, qkv)
        modules[f"{ours}.attn.to_out.0"] = OriginalModule(f"{image}.attn.proj")
        if i in dual_attention_layers:
            for index, p in enumerate("qkv"):
                modules[f"{ours}.attn2.to_{p}"] = OriginalModule(f"{image}.attn2.qkv", index, qkv)
            modules[f"{ours}.attn2.to_out.0"] = OriginalModule(f"{image}.attn2.proj")
        modules[f"{ours}.norm1.linear"] = OriginalModule(f"{image}.adaLN_modulation.1")
        # The last block's text modulation is a two-chunk shift|scale there, diffusers' scale|shift.
        modules[f"{ours}.norm1_context.linear"] = OriginalModule(f"{text}.adaLN_modulation.1", swapped=last)
        modules[f"{ours}.ff.net.0.proj"] = OriginalModule(f"{image}.mlp.fc1")
        modules[f"{ours}.ff.net.2"] = OriginalModule(f"{image}.mlp.fc2")
        if not last:
            modules[f"{ours}.attn.to_add_out"] = OriginalModule(f"{text}.attn.proj")
            modules[f"{ours}.ff_context.net.0.proj"] = OriginalModule(f"{text}.mlp.fc1")
            modules[f"{ours}.ff_context.net.2"] = OriginalModule(f"{text}.mlp.fc2")
    return modules


def parameter_map(config: Mapping[str, Any]) -> dict[str, str]:
    """The bare parameters: diffusers key → SAI key. The q/k norms (3.5's `qk_norm`) are listed with a weight and a
    bias, whichever the norm has."""
    params = {"pos_embed.pos_embed": "pos_embed"}
    if not config.get("qk_norm"):
        return params
    _, _, dual = _topology(config)
    for i in range(int(config["num_layers"])):
        ours, theirs = f"transformer_blocks.{i}", f"joint_blocks.{i}"
        norms = {
            "attn.norm_q": "x_block.attn.ln_q",
            "attn.norm_k": "x_block.attn.ln_k",
            "attn.norm_added_q": "context_block.attn.ln_q",
            "attn.norm_added_k": "context_block.attn.ln_k",
        }
        if i in dual:
            norms |= {"attn2.norm_q": "x_block.attn2.ln_q", "attn2.norm_k": "x_block.attn2.ln_k"}
        for norm, original in norms.items():
            for p in _PARAMETERS:
                params[f"{ours}.{norm}.{p}"] = f"{theirs}.{original}.{p}"
    return params


def transformer_to_original(state: Mapping[str, torch.Tensor], config: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """An `SD3Transformer2DModel` state dict in SAI's names (without the `model.diffusion_model.` prefix), placed by
    `module_map` and `parameter_map`; raises ValueError naming what it cannot place."""
    left = dict(state)
    out: dict[str, torch.Tensor] = {}
    fused: dict[str, list[torch.Tensor | None]] = {}
    for module, original in module_map(config).items():
        for parameter in _PARAMETERS:
            value = left.pop(f"{module}.{parameter}", None)
            if value is None:
                continue
            key = f"{original.path}.{parameter}"
            if original.swapped:
                value = swap_halves(value)
            if original.fused:
                fused.setdefault(key, [None] * len(original.rows))[original.index] = value
            else:
                out[key] = value
    for key, parts in fused.items():
        if any(part is None for part in parts):
            raise ValueError(f"{key}: only some of its {len(parts)} projections are there")
        out[key] = torch.cat(parts, dim=0)
    out["pos_embed"] = left.pop("pos_embed.pos_embed")
    for ours, theirs in parameter_map(config).items():
        value = left.pop(ours, None)
        if value is not None:
            out[theirs] = value
    if left:
        raise ValueError(f"{len(left)} transformer weights have no place in the original layout: {sorted(left)[:4]}")
    return out


def text_encoder_to_original(part: str, state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A text encoder's state dict under its `text_encoders.…` prefix: transformers' names, CLIP's under
    `text_model.` (as its checkpoints hold them), T5's tied token table as both `shared` and `encoder.embed_tokens` (as
    SAI's files hold it)."""
    prefix = TEXT_ENCODER_PREFIXES[part]
    out = {}
    for key, value in state.items():
        if part != "text_encoder_3" and not key.startswith(("text_model.", "text_projection.")):
            key = f"text_model.{key}"
        out[prefix + key] = value
    if part == "text_encoder_3" and "shared.weight" in state:
        out[prefix + "encoder.embed_tokens.weight"] = state["shared.weight"].clone()
    return out
