"""A tiny EfficientNet encoder for Würstchen v2 and Stable Cascade: the real key layout at a tiny width.

Every key of the published effnet files exists (same stages, blocks and layers), only the channel counts differ, so
the tiny encoder's state dict loads through the same code (`encoder_from_state_dict`) as the real one.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import save

from onetrainer.families.effnet import EfficientNetEncoder
from onetrainer.util.fs import atomic_write_bytes

# Stem, then each stage's output; torchvision rounds widths to multiples of 8, so these are the smallest it builds.
TINY_CHANNELS = (8, 8, 16, 16, 32, 32, 48)
TINY_HEAD_CHANNELS = 64


def build_effnet_encoder(wuerstchen: bool, seed: int = 0) -> EfficientNetEncoder:
    """Würstchen's encoder (affine mapper norm) or Cascade's (not affine), seeded, in eval mode.

    The norms get non-trivial statistics so that a test notices a norm applied wrongly or not at all.
    """
    encoder = EfficientNetEncoder(affine=wuerstchen, channels=TINY_CHANNELS, head_channels=TINY_HEAD_CHANNELS)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, tensor in sorted(encoder.state_dict().items()):
            if name.endswith("num_batches_tracked"):
                continue
            if name.endswith(("running_var", "norm.weight")) or (tensor.ndim == 1 and name.endswith("weight")):
                tensor.copy_(0.5 + torch.rand(tensor.shape, generator=generator))
            elif tensor.ndim == 4:
                fan_in = tensor.shape[1] * tensor.shape[2] * tensor.shape[3]
                tensor.copy_(torch.randn(tensor.shape, generator=generator) / fan_in**0.5)
            else:
                tensor.copy_(0.1 * torch.randn(tensor.shape, generator=generator))
    return encoder.eval().requires_grad_(False)


def save_effnet_encoder(path: str | Path, wuerstchen: bool, seed: int = 0) -> Path:
    """The tiny encoder as a safetensors file with the published files' keys (what a config's effnet part names)."""
    state = {k: v.contiguous() for k, v in build_effnet_encoder(wuerstchen, seed).state_dict().items()}
    atomic_write_bytes(path, save(state))
    return Path(path)


def tiny_effnet_file(wuerstchen: bool, cache_root: str | Path | None = None) -> Path:
    """The tiny encoder (seed 0) as a file in the tiny-model cache, written on first use: what a `tiny:wuerstchen` or
    `tiny:cascade` base puts in `effnet_encoder.model_name`, so the family loads it like a user's file."""
    from onetrainer.tiny.storage import TINY_BUILD_LOCK, TINY_MODEL_VERSION, default_cache_root

    root = Path(cache_root) if cache_root is not None else default_cache_root()
    kind = "wuerstchen" if wuerstchen else "cascade"
    target = root / "tiny-models" / f"effnet-{kind}-v{TINY_MODEL_VERSION}.safetensors"
    if target.is_file():  # written by rename only, so a file there is whole
        return target
    with TINY_BUILD_LOCK:
        if not target.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            save_effnet_encoder(target, wuerstchen)
    return target
