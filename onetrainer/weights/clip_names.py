"""CLIP text encoders' module paths as files name them, whichever transformers is installed.

transformers 5 drops CLIPTextModel's `text_model.` level (its modules are `encoder.layers.N…`);
CLIPTextModelWithProjection keeps it, and so do original checkpoints, kohya names
(`lora_te_text_model_encoder_layers_N_…`) and diffusers' LoRA files (`text_encoder.text_model.encoder.layers.N…`, the
names ComfyUI maps and diffusers' loader reads, dropping the level where the installed model has none). Our files
always carry it: what they hold does not depend on the transformers version that wrote them.
"""

from __future__ import annotations

import torch

TEXT_MODEL = "text_model."


def with_text_model(module_path: str) -> str:
    """A CLIP text encoder's module path with the `text_model.` level."""
    return module_path if module_path.startswith(TEXT_MODEL) else TEXT_MODEL + module_path


def is_clip_text_model(module: torch.nn.Module) -> bool:
    """Whether `module` is one of transformers' CLIP text encoders (with or without the projection)."""
    return type(module).__name__.startswith("CLIPText")


def file_module_path(encoder: torch.nn.Module, module_path: str) -> str:
    """The name files give the `encoder`'s module at `module_path`: CLIP's with the `text_model.` level."""
    return with_text_model(module_path) if is_clip_text_model(encoder) else module_path


def model_module_path(module: torch.nn.Module, file_path: str) -> str:
    """The path in `module` of the module a file names `file_path`: without the `text_model.` level where the installed
    model has none."""
    if is_clip_text_model(module) and file_path.startswith(TEXT_MODEL) and not hasattr(module, "text_model"):
        return file_path[len(TEXT_MODEL) :]
    return file_path
