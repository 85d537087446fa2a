"""Z-Image's transformer between diffusers' names and ComfyUI's checkpoint layout.

Tongyi-MAI publishes Z-Image in diffusers' names; ComfyUI's checkpoints (and the files it writes) use the NextDiT
names: the attention's q/k/v fused in one `attention.qkv` (rows q|k|v), `attention.out` for `to_out.0`,
`q_norm`/`k_norm` for `norm_q`/`norm_k`, and `x_embedder` / `final_layer` without diffusers' `all_…2-1` level, under
`model.diffusion_model.` or not. diffusers' `from_single_file` converts that layout (and takes a file already in its
own names as it is); this module writes it, and reads either layout for `transformer.model_name`.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from onetrainer.weights.checkpoint_files import without_prefix

# diffusers' name → ComfyUI's, as substrings of a key (module levels, so no rename matches inside another name)
_RENAMES = (
    ("all_x_embedder.2-1.", "x_embedder."),
    ("all_final_layer.2-1.", "final_layer."),
    (".attention.to_out.0.", ".attention.out."),
    (".attention.norm_q.", ".attention.q_norm."),
    (".attention.norm_k.", ".attention.k_norm."),
)
_PROJECTIONS = ("to_q", "to_k", "to_v")


def to_comfy(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A `ZImageTransformer2DModel` state dict in ComfyUI's layout; ValueError where a block has only some of q/k/v."""
    out: dict[str, torch.Tensor] = {}
    fused: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in state.items():
        block, dot, rest = key.partition(".attention.")
        projection = rest.partition(".")[0]
        if dot and projection in _PROJECTIONS:
            fused.setdefault(f"{block}.attention.qkv.{rest.partition('.')[2]}", {})[projection] = value
            continue
        for ours, theirs in _RENAMES:
            key = key.replace(ours, theirs)
        out[key] = value
    for key, parts in fused.items():
        if set(parts) != set(_PROJECTIONS):
            raise ValueError(f"{key}: only {', '.join(sorted(parts))} of q/k/v are there")
        out[key] = torch.cat([parts[p] for p in _PROJECTIONS], dim=0)
    return out


def to_diffusers(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A transformer file in either layout (a `model.diffusion_model.` or `diffusion_model.` prefix allowed) in
    diffusers' names."""
    plain = without_prefix(state)
    if not any(".attention.qkv." in k or k.startswith(("x_embedder.", "final_layer.")) for k in plain):
        return plain
    out: dict[str, torch.Tensor] = {}
    for key, value in plain.items():
        if key == "norm_final.weight":  # in ComfyUI's model, unused by diffusers'
            continue
        if ".attention.qkv." in key:
            if value.shape[0] % 3:
                raise ValueError(f"{key} has {value.shape[0]} rows, not q|k|v of equal size")
            for projection, rows in zip(_PROJECTIONS, value.chunk(3, dim=0)):
                out[key.replace(".attention.qkv.", f".attention.{projection}.")] = rows
            continue
        for ours, theirs in _RENAMES:
            if theirs.startswith("."):
                key = key.replace(theirs, ours)
            elif key.startswith(theirs):  # the top-level modules: a name at the start, not inside another
                key = ours + key[len(theirs) :]
        out[key] = value
    return out
