"""SVDQuant (OneTrainer's `quantization.svd_dtype` / `svd_rank`): a quantized Linear keeps the largest `rank`
singular directions of its weight in a higher precision beside the quantized rest.

W = U·S·Vᵀ; the layer keeps `svd_up` = U_r·S_r (out × r) and `svd_down` = V_rᵀ (r × in) in `svd_dtype`, and quantizes
only the residual W − svd_up·svd_down, whose range is smaller once the dominant directions (and the outliers they
carry) are out of it, so 8 bits lose less. The forward pass adds x·svd_downᵀ·svd_upᵀ to the quantized layer's output.
Both factors are frozen, plain parameters (layer offloading moves them with the block).

The decomposition is a full SVD (a randomized low-rank one leaves the residual's range nearly as wide), computed on the
training GPU when there is one (seconds for a 12 B transformer; minutes on a CPU), and cached on disk by the weight's
fingerprint, as OneTrainer caches it, up to `MAX_CACHED_RANK` directions, so a second run (or another rank) reads it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import torch

MAX_CACHED_RANK = 128


@dataclass(frozen=True)
class SvdSettings:
    rank: int
    dtype: torch.dtype  # of the two factors
    device: torch.device  # where the decomposition runs
    cache_dir: Path | None = None


def fingerprint(weight: torch.Tensor) -> str:
    """A name for a weight's decomposition: its shape and a hash of its float32 values."""
    values = weight.detach().to(device="cpu", dtype=torch.float32).contiguous()
    digest = hashlib.sha256(str(tuple(values.shape)).encode())
    digest.update(values.numpy().tobytes())
    return digest.hexdigest()[:40]


def _decompose(weight: torch.Tensor, settings: SvdSettings) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """U, S, Vh of `weight` (float32, on the CPU), up to MAX_CACHED_RANK directions; from the cache when there."""
    path = None
    if settings.cache_dir is not None:
        path = settings.cache_dir / f"{fingerprint(weight)}.pt"
        with contextlib.suppress(FileNotFoundError, RuntimeError, EOFError):
            u, s, vh = torch.load(path, map_location="cpu", weights_only=True)
            if s.numel() >= min(settings.rank, min(weight.shape)):
                return u, s, vh
    u, s, vh = torch.linalg.svd(weight.detach().to(device=settings.device, dtype=torch.float32), full_matrices=False)
    keep = max(settings.rank, MAX_CACHED_RANK) if path is not None else settings.rank
    u, s, vh = (t.cpu() for t in (u[:, :keep], s[:keep], vh[:keep, :]))
    if path is not None:
        _write_atomically(path, (u.clone(), s.clone(), vh.clone()))
    return u, s, vh


def _write_atomically(path: Path, value) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    torch.save(value, partial)
    os.replace(partial, path)


def split_low_rank(weight: torch.Tensor, settings: SvdSettings) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(svd_up, svd_down, residual): the factors in `settings.dtype`, the residual in the weight's dtype, where
    weight ≈ svd_up·svd_down + residual (exactly, up to the factors' rounding)."""
    u, s, vh = _decompose(weight, settings)
    rank = min(settings.rank, s.numel())
    up = (u[:, :rank] * s[:rank]).to(settings.dtype).contiguous()
    down = vh[:rank, :].to(settings.dtype).contiguous()
    residual = weight.detach().float().cpu() - up.float() @ down.float()
    return up, down, residual.to(device=weight.device, dtype=weight.dtype)


class SvdCorrected:
    """Mixed in before a quantized Linear class: adds the low-rank correction to its output. The state dict is a
    plain layer's: the quantized class's weight (its own layout) with the correction added back, no factors."""

    svd_up: torch.nn.Parameter
    svd_down: torch.nn.Parameter

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        low = torch.nn.functional.linear(x, self.svd_down.to(x.dtype))
        return super().forward(x) + torch.nn.functional.linear(low, self.svd_up.to(x.dtype))  # type: ignore[misc]

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)  # type: ignore[misc]
        up = destination.pop(prefix + "svd_up")
        down = destination.pop(prefix + "svd_down")
        weight = destination[prefix + "weight"]
        destination[prefix + "weight"] = weight.float() + up.detach().float() @ down.detach().float()


_CLASSES: dict[type, type] = {}


def corrected_class(cls: type) -> type:
    """`cls` with the low-rank correction (one class per quantized Linear class)."""
    if cls not in _CLASSES:
        _CLASSES[cls] = type(f"Svd{cls.__name__}", (SvdCorrected, cls), {"__module__": __name__})
    return _CLASSES[cls]


def attach_correction(layer: torch.nn.Linear, up: torch.Tensor, down: torch.Tensor) -> None:
    """Make an already quantized `layer` add up·down·x (its class becomes the corrected one)."""
    layer.__class__ = corrected_class(type(layer))
    layer.svd_up = torch.nn.Parameter(up.to(layer.weight.device), requires_grad=False)
    layer.svd_down = torch.nn.Parameter(down.to(layer.weight.device), requires_grad=False)
