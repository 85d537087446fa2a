"""Embedding files (textual inversion) in the AUTOMATIC1111 / ComfyUI format.

SD 1.x / 2.x: one tensor `emb_params` of shape [tokens, dim]. SDXL: `clip_l` and `clip_g`, one per text encoder.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from onetrainer.util.fs import atomic_file


def save_embedding(path: str | os.PathLike, tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> None:
    clean = {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}
    with atomic_file(path) as tmp:
        save_file(clean, str(tmp), metadata=metadata)


def load_embedding(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Read an embedding file: safetensors, or an A1111 `.pt` (`string_to_param`) without executing code."""
    path = Path(path)
    if path.suffix.lower() == ".safetensors":
        return load_file(str(path))
    data = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(data, dict) and "string_to_param" in data:
        params = data["string_to_param"]
        return {"emb_params": next(iter(params.values()))}
    if isinstance(data, dict) and all(isinstance(v, torch.Tensor) for v in data.values()):
        return data
    raise ValueError(f"{path} is not an embedding file this trainer can read")
