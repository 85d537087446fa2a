"""Krea 2's transformer between diffusers' names and Krea's own checkpoint layout (krea/Krea-2-Raw's raw.safetensors,
OneTrainer's ORIGINAL_TRANSFORMER): the same tensors under other names, q/k/v split in both, except each block's six
modulation vectors, which Krea's file keeps flattened into one ([6 · width]) where diffusers has a [6, width] table.
diffusers' `from_single_file` reads that layout (with or without ComfyUI's `model.diffusion_model.` prefix); this
module writes it, and reads either layout for `transformer.model_name`."""

from __future__ import annotations

import re
from collections.abc import Mapping

import torch

from onetrainer.weights.checkpoint_files import without_prefix

# diffusers' leading module → Krea's
_TOP = (
    ("img_in.", "first."),
    ("time_embed.linear_1.", "tmlp.0."),
    ("time_embed.linear_2.", "tmlp.2."),
    ("time_mod_proj.", "tproj.1."),
    ("txt_in.norm.weight", "txtmlp.0.scale"),
    ("txt_in.linear_1.", "txtmlp.1."),
    ("txt_in.linear_2.", "txtmlp.3."),
    ("text_fusion.", "txtfusion."),
    ("transformer_blocks.", "blocks."),
    ("final_layer.linear.", "last.linear."),
    ("final_layer.norm.weight", "last.norm.scale"),
    ("final_layer.scale_shift_table", "last.modulation.lin"),
)
# inside a block (the DiT's and the text fusion's): diffusers' → Krea's
_BLOCK = (
    (".attn.to_q.", ".attn.wq."),
    (".attn.to_k.", ".attn.wk."),
    (".attn.to_v.", ".attn.wv."),
    (".attn.to_out.0.", ".attn.wo."),
    (".attn.to_gate.", ".attn.gate."),
    (".attn.norm_q.weight", ".attn.qknorm.qnorm.scale"),
    (".attn.norm_k.weight", ".attn.qknorm.knorm.scale"),
    (".ff.", ".mlp."),
    (".norm1.weight", ".prenorm.scale"),
    (".norm2.weight", ".postnorm.scale"),
    (".scale_shift_table", ".mod.lin"),
)
_DIT_TABLE = re.compile(r"^transformer_blocks\.\d+\.scale_shift_table$")
_KREA_TABLE = re.compile(r"^blocks\.\d+\.mod\.lin$")


def _rename(key: str, top, block) -> str:
    for old, new in top:
        if key.startswith(old):
            key = new + key[len(old) :]
            break
    for old, new in block:
        key = key.replace(old, new)
    return key


def to_original(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A `Krea2Transformer2DModel` state dict in Krea's names, each block's modulation table flattened."""
    out = {}
    for key, value in state.items():
        out[_rename(key, _TOP, _BLOCK)] = value.reshape(-1) if _DIT_TABLE.match(key) else value
    return out


def to_diffusers(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Krea's layout (or diffusers' own, which passes as it is), ComfyUI's prefix allowed, in diffusers' names."""
    state = without_prefix(dict(state))
    if any(k.startswith("transformer_blocks.") for k in state):
        return state
    top = tuple((new, old) for old, new in _TOP)
    block = tuple((new, old) for old, new in _BLOCK)
    out = {}
    for key, value in state.items():
        out[_rename(key, top, block)] = value.reshape(6, -1) if _KREA_TABLE.match(key) else value
    return out
