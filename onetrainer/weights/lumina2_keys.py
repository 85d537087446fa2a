"""Lumina-Image 2.0's transformer between diffusers' names and the layout Alpha-VLLM released it in (the NextDiT
names, which ComfyUI's model and its checkpoints use, under `model.diffusion_model.` there; OneTrainer's
ORIGINAL_TRANSFORMER here): each attention's q/k/v fused in one `attention.qkv` (rows q | k | v, k and v as wide as
the key/value heads), `attention.out`, `q_norm` / `k_norm`, the feed-forward's `w1`/`w2`/`w3`, the modulation as
`adaLN_modulation.1`, the norms around attention as `attention_norm1/2`, `cap_embedder`, `t_embedder.mlp` and
`final_layer`; the release also holds an unused `norm_final` (ones here). diffusers' `from_single_file` reads that
layout; this module writes it, and reads either layout for `transformer.model_name`."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from onetrainer.weights.checkpoint_files import without_prefix

# diffusers' leading module → the release's
_TOP = (
    ("time_caption_embed.caption_embedder.", "cap_embedder."),
    ("time_caption_embed.timestep_embedder.linear_1.", "t_embedder.mlp.0."),
    ("time_caption_embed.timestep_embedder.linear_2.", "t_embedder.mlp.2."),
    ("norm_out.linear_1.", "final_layer.adaLN_modulation.1."),
    ("norm_out.linear_2.", "final_layer.linear."),
)
# inside a block (the refiners' and the joint ones'): diffusers' → the release's
_BLOCK = (
    (".attn.to_out.0.", ".attention.out."),
    (".attn.norm_q.", ".attention.q_norm."),
    (".attn.norm_k.", ".attention.k_norm."),
    (".feed_forward.linear_1.", ".feed_forward.w1."),
    (".feed_forward.linear_2.", ".feed_forward.w2."),
    (".feed_forward.linear_3.", ".feed_forward.w3."),
    (".norm1.linear.", ".adaLN_modulation.1."),
    (".norm1.norm.", ".attention_norm1."),  # a modulated block's
    (".norm1.", ".attention_norm1."),  # the caption refiner's (no modulation)
    (".norm2.", ".attention_norm2."),
)
_PROJECTIONS = ("to_q", "to_k", "to_v")
UNUSED_NORM = "norm_final.weight"


def _rename(key: str, top, block) -> str:
    for old, new in top:
        if key.startswith(old):
            return new + key[len(old) :]
    for old, new in block:
        if old in key:
            return key.replace(old, new)
    return key


def released_name(key: str) -> str:
    """A diffusers weight name (or module path + ".weight") in the released layout; q/k/v keep theirs (`to_original`
    fuses them)."""
    return _rename(key, _TOP, _BLOCK)


def to_original(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A `Lumina2Transformer2DModel` state dict in the released layout; ValueError where a block has only some of
    q/k/v."""
    out: dict[str, torch.Tensor] = {}
    fused: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in state.items():
        block, dot, rest = key.partition(".attn.")
        projection, _, suffix = rest.partition(".")
        if dot and projection in _PROJECTIONS:
            fused.setdefault(f"{block}.attention.qkv.{suffix}", {})[projection] = value
            continue
        out[_rename(key, _TOP, _BLOCK)] = value
    for key, parts in fused.items():
        if set(parts) != set(_PROJECTIONS):
            raise ValueError(f"{key}: only {', '.join(sorted(parts))} of q/k/v are there")
        out[key] = torch.cat([parts[p] for p in _PROJECTIONS], dim=0)
    width = state["x_embedder.weight"].shape[0]
    out[UNUSED_NORM] = torch.ones(width, dtype=state["x_embedder.weight"].dtype)
    return out


def to_diffusers(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A transformer file in either layout (a `model.diffusion_model.` or `diffusion_model.` prefix allowed) in
    diffusers' names. The fused rows split as q (the model's width: its heads times their width) then k and v alike."""
    plain = without_prefix(dict(state))
    if not any(".attention.qkv." in k or k.startswith(("cap_embedder.", "final_layer.")) for k in plain):
        return plain
    width = plain["x_embedder.weight"].shape[0]
    top = tuple((new, old) for old, new in _TOP)
    # the release's → diffusers': `attention_norm1` is `norm1.norm` in a modulated block, `norm1` in the caption's
    modulated = {k.partition(".adaLN_modulation.")[0] for k in plain if ".adaLN_modulation." in k}
    out: dict[str, torch.Tensor] = {}
    for key, value in plain.items():
        if key == UNUSED_NORM:
            continue
        if ".attention.qkv." in key:
            rows = value.shape[0] - width
            if rows <= 0 or rows % 2:
                raise ValueError(f"{key} has {value.shape[0]} rows, not q ({width}) and k, v of equal size")
            for projection, part in zip(_PROJECTIONS, value.split([width, rows // 2, rows // 2], dim=0)):
                out[key.replace(".attention.qkv.", f".attn.{projection}.")] = part
            continue
        block = key.partition(".attention_norm1.")[0]
        if ".attention_norm1." in key:
            inner = ".norm1.norm." if block in modulated else ".norm1."
            out[key.replace(".attention_norm1.", inner)] = value
            continue
        renamed = _rename(key, top, ())
        for ours, theirs in _BLOCK:
            if theirs in renamed and theirs != ".attention_norm1.":
                renamed = renamed.replace(theirs, ours)
                break
        out[renamed] = value
    return out
