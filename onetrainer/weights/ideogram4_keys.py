"""Ideogram 4's transformer in its original layout (OneTrainer's ORIGINAL_TRANSFORMER, the layout ai-toolkit's and
ComfyUI-style LoRA files name, which diffusers' Ideogram 4 LoRA conversion reads): diffusers' names, except that each
block's attention holds one fused `attention.qkv` projection (q, k, v stacked in that order along the output) and
calls its output projection `attention.o` (diffusers' `attention.to_out.0`). A file may carry ComfyUI's
`model.diffusion_model.` / `diffusion_model.` prefix."""

from __future__ import annotations

import re

import torch

FILE_PREFIXES = ("model.diffusion_model.", "diffusion_model.")
SPLIT = ("to_q", "to_k", "to_v")
_ATTENTION = re.compile(r"^(layers\.\d+\.attention)\.(to_q|to_k|to_v|to_out\.0|qkv|o)\.(weight)$")


def to_original(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """diffusers' transformer state in the original names: q/k/v fused into `attention.qkv`, `to_out.0` as `o`."""
    out: dict[str, torch.Tensor] = {}
    fused: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in state.items():
        match = _ATTENTION.match(key)
        if match is None:
            out[key] = value
        elif match.group(2) in SPLIT:
            fused.setdefault(match.group(1), {})[match.group(2)] = value
        else:
            out[f"{match.group(1)}.o.weight"] = value
    for prefix, parts in fused.items():
        if set(parts) != set(SPLIT):
            raise ValueError(f"{prefix} lacks {sorted(set(SPLIT) - set(parts))}: q, k and v fuse together")
        out[f"{prefix}.qkv.weight"] = torch.cat([parts[p] for p in SPLIT], dim=0)
    return out


def to_diffusers(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A transformer file's tensors in diffusers' names: the original layout split back (diffusers' own names pass as
    they are), ComfyUI's prefix removed where every key has it."""
    for prefix in FILE_PREFIXES:
        if state and all(key.startswith(prefix) for key in state):
            state = {key[len(prefix) :]: value for key, value in state.items()}
            break
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        match = _ATTENTION.match(key)
        if match is None or match.group(2) in (*SPLIT, "to_out.0"):
            out[key] = value
        elif match.group(2) == "o":
            out[f"{match.group(1)}.to_out.0.weight"] = value
        else:
            if value.shape[0] % 3:
                raise ValueError(f"{key} has {value.shape[0]} outputs, not q, k and v of one width")
            for name, part in zip(SPLIT, value.chunk(3, dim=0)):
                out[f"{match.group(1)}.{name}.weight"] = part.contiguous()
    return out
