"""Ideogram 4's transformer in its original layout (OneTrainer's ORIGINAL_TRANSFORMER, the layout ai-toolkit's and
ComfyUI-style LoRA files name, which diffusers' Ideogram 4 LoRA conversion reads): diffusers' names, except that each
block's attention holds one fused `attention.qkv` projection (q, k, v stacked in that order along the output) and
calls its output projection `attention.o` (diffusers' `attention.to_out.0`). A file may carry ComfyUI's
`model.diffusion_model.` / `diffusion_model.` prefix."""

from __future__ import annotations

import functools
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


# -- LoRA files over the original names (`weights/fused_transformer_lora.FusedLayout`) ---------------------------------

# The transformer's linear modules outside the blocks, and in each block besides q/k/v and the output projection: the
# same path in both layouts.
_TOP_LEVEL = (
    "input_proj",
    "llm_cond_proj",
    "t_embedding.mlp_in",
    "t_embedding.mlp_out",
    "adaln_proj",
    "final_layer.linear",
    "final_layer.adaln_modulation",
)
_BLOCK = ("feed_forward.w1", "feed_forward.w2", "feed_forward.w3", "adaln_modulation")


def module_map(config) -> dict:
    """Every linear module of the transformer (diffusers path) → where its output rows live in the original layout
    (q/k/v as thirds of `attention.qkv`, `to_out.0` as `attention.o`), for a diffusers config."""
    return dict(
        _module_map(int(config["num_attention_heads"]) * int(config["attention_head_dim"]), int(config["num_layers"]))
    )


def original_module(module_path: str, config):
    """Where one diffusers module lives (`module_map`), None for one without a linear weight."""
    return module_map(config).get(module_path)


@functools.lru_cache(maxsize=16)
def _module_map(width: int, num_layers: int) -> dict:
    from onetrainer.weights.fused_lora import OriginalModule

    modules = {path: OriginalModule(path) for path in _TOP_LEVEL}
    for i in range(num_layers):
        for index, name in enumerate(SPLIT):
            modules[f"layers.{i}.attention.{name}"] = OriginalModule(f"layers.{i}.attention.qkv", index, (width,) * 3)
        modules[f"layers.{i}.attention.to_out.0"] = OriginalModule(f"layers.{i}.attention.o")
        for name in _BLOCK:
            modules[f"layers.{i}.{name}"] = OriginalModule(f"layers.{i}.{name}")
    return modules
