"""COMFY_LORA: a LoRA file over the module paths of ComfyUI's model, dots kept, under the prefix ComfyUI keeps each
part of the model at (`diffusion_model.` for the denoiser; a text encoder's own, e.g. `text_encoders.qwen3_4b.
transformer.model.`), with kohya's suffixes (`.lora_down.weight`, `.lora_up.weight`, `.alpha`, and LyCORIS' for the
other kinds). ComfyUI's LoRA loader takes `<prefix><module path>` for every weight of the model it loaded, and for the
models whose checkpoints use diffusers' module names (Z-Image, Qwen-Image) diffusers' loaders read the same file.

Writing goes through the generic kohya writer with these names; reading renames them to the kohya names the generic
reader knows (`kohya_names`), for the family's `kohya_named_lora`.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch


def kohya_names(state: Mapping[str, torch.Tensor], names: Mapping[str, str]) -> dict[str, torch.Tensor]:
    """`state` with every `<comfy module name>.<suffix>` key renamed to `<kohya module name>.<suffix>` (`names`:
    comfy name → kohya name); keys of no known module stay as they are, for the reader to report."""
    renamed = {}
    for key, value in state.items():
        module, suffix = module_and_suffix(key, names)
        renamed[f"{names[module]}.{suffix}" if module is not None else key] = value
    return renamed


def module_and_suffix(key: str, modules: Mapping[str, object]) -> tuple[str | None, str]:
    """The longest module name of `modules` that `key` starts with (`<module>.<suffix>`) and the suffix; (None, key)
    where there is none."""
    head, suffix = key, ""
    while "." in head:
        head, _, last = head.rpartition(".")
        suffix = f"{last}.{suffix}" if suffix else last
        if head in modules:
            return head, suffix
    return None, key
