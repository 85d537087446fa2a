"""diffusers' LoRA layout (DIFFUSERS_LORA): `<part>.<module path>.lora_A.weight` / `.lora_B.weight`, peft's names, with
alpha folded into lora_B (the file has no alpha), as diffusers' `load_lora_weights` reads it. A CLIP text encoder's
modules keep their `text_model.` level whichever transformers wrote the file (`clip_names.py`)."""

from __future__ import annotations

import torch

from onetrainer.weights import clip_names
from onetrainer.weights.kohya_lora import LORA_B


def file_state(
    part: str, module: torch.nn.Module, state: dict[str, torch.Tensor], ranks: dict[str, int], alphas: dict[str, float]
) -> dict[str, torch.Tensor]:
    """The part's plain LoRA weights (`state`: `<module path>.lora_A.weight` / `.lora_B.weight` of the part `module`)
    under the file's names."""
    out = {}
    for key, value in state.items():
        path, _, weight = key.rpartition(".lora_")
        if key.endswith(LORA_B):
            value = value * (alphas[path] / ranks[path])
        out[f"{part}.{clip_names.file_module_path(module, path)}.lora_{weight}"] = value
    return out


def model_state(part: str, module: torch.nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The part's entries of a file (`file_state`'s names) under the installed model's module paths."""
    prefix = f"{part}."
    out = {}
    for key, value in state.items():
        if key.startswith(prefix) and "lora_" in key:
            path, _, weight = key[len(prefix) :].rpartition(".lora_")
            out[f"{clip_names.model_module_path(module, path)}.lora_{weight}"] = value
    return out
