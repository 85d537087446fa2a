"""Latents as 2x2 patch tokens, the input of the transformers that take packed latents (Flux.1, Chroma, Qwen-Image):
each 2x2 patch of a [B, C, h, w] latent becomes one token of 4C features, (c, row, column) in order, tokens
row-major."""

from __future__ import annotations

import torch

PATCH = 2  # latent pixels per patch side


def pack(latents: torch.Tensor) -> torch.Tensor:
    """[B, C, h, w] → [B, (h/2)·(w/2), 4C]: each 2x2 patch one token, its channels (c, row, column) in order."""
    b, c, h, w = latents.shape
    patches = latents.view(b, c, h // PATCH, PATCH, w // PATCH, PATCH).permute(0, 2, 4, 1, 3, 5)
    return patches.reshape(b, (h // PATCH) * (w // PATCH), c * PATCH * PATCH)


def unpack(tokens: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """The inverse of `pack` for latents of `height` × `width`."""
    b, _, features = tokens.shape
    c = features // (PATCH * PATCH)
    patches = tokens.view(b, height // PATCH, width // PATCH, c, PATCH, PATCH).permute(0, 3, 1, 4, 2, 5)
    return patches.reshape(b, c, height, width)
