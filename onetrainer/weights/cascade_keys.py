"""Stable Cascade's stage C: diffusers' `StableCascadeUNet` state dict ↔ Stability's `stage_c.safetensors` layout.

Stability's files (`stage_c.safetensors`, `stage_c_lite.safetensors`, and what ComfyUI and
`StableCascadeUNet.from_single_file` read) use the same names as diffusers except in the attention blocks, where
Stability keeps torch's `nn.MultiheadAttention`: one fused `attention.attn.in_proj_weight/bias` (q, k, v stacked in
that order) and `attention.attn.out_proj`, where diffusers has `attention.to_q/to_k/to_v/to_out.0`.

Which blocks have attention comes from the model config (a model built on the meta device), so a file that lacks
one, or has one too many, is refused with the keys named instead of loading half a model.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from typing import Any

import torch

_QKV = ("to_q", "to_k", "to_v")
_FUSED = "attn.in_proj_"
_DIFFUSERS_OUT = "to_out.0."
_STABILITY_OUT = "attn.out_proj."


def attention_prefixes(config: Mapping[str, Any]) -> tuple[str, ...]:
    """The module paths of every attention (`….attention`) in a StableCascadeUNet with this config."""
    return _attention_prefixes(_freeze(config))


def _freeze(config: Mapping[str, Any]) -> tuple:
    def freeze(value: Any) -> Any:
        return tuple(freeze(v) for v in value) if isinstance(value, list | tuple) else value

    return tuple(sorted((k, freeze(v)) for k, v in config.items() if not k.startswith("_")))


@lru_cache(maxsize=8)
def _attention_prefixes(frozen: tuple) -> tuple[str, ...]:
    from diffusers import StableCascadeUNet
    from diffusers.models.unets.unet_stable_cascade import SDCascadeAttnBlock

    with torch.device("meta"):
        model = StableCascadeUNet.from_config(dict(frozen))
    return tuple(
        f"{name}.attention" for name, module in model.named_modules() if isinstance(module, SDCascadeAttnBlock)
    )


def to_stability(state_dict: Mapping[str, torch.Tensor], config: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """diffusers → Stability: q, k, v concatenated into `attn.in_proj_*`, `to_out.0` renamed `attn.out_proj`."""
    prefixes = attention_prefixes(config)
    expected = {f"{p}.{proj}.{kind}" for p in prefixes for proj in (*_QKV, "to_out.0") for kind in ("weight", "bias")}
    _check(state_dict, expected, found=lambda k: ".attention.to_" in k, layout="diffusers")
    out = {k: v for k, v in state_dict.items() if k not in expected}
    for prefix in prefixes:
        for kind in ("weight", "bias"):
            out[f"{prefix}.{_FUSED}{kind}"] = torch.cat([state_dict[f"{prefix}.{q}.{kind}"] for q in _QKV], dim=0)
            out[f"{prefix}.{_STABILITY_OUT}{kind}"] = state_dict[f"{prefix}.{_DIFFUSERS_OUT}{kind}"]
    return out


def to_diffusers(state_dict: Mapping[str, torch.Tensor], config: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """Stability → diffusers: `attn.in_proj_*` split in three (q, k, v), `attn.out_proj` renamed `to_out.0`."""
    prefixes = attention_prefixes(config)
    expected = {
        f"{p}.{name}{kind}" for p in prefixes for name in (_FUSED, _STABILITY_OUT) for kind in ("weight", "bias")
    }
    _check(state_dict, expected, found=lambda k: ".attention.attn." in k, layout="Stability's stage C")
    out = {k: v for k, v in state_dict.items() if k not in expected}
    for prefix in prefixes:
        for kind in ("weight", "bias"):
            fused = state_dict[f"{prefix}.{_FUSED}{kind}"]
            if fused.shape[0] % 3:
                raise ValueError(f"{prefix}.{_FUSED}{kind} has {fused.shape[0]} rows, not q, k and v stacked")
            for name, part in zip(_QKV, fused.chunk(3, dim=0)):
                out[f"{prefix}.{name}.{kind}"] = part
            out[f"{prefix}.{_DIFFUSERS_OUT}{kind}"] = state_dict[f"{prefix}.{_STABILITY_OUT}{kind}"]
    return out


def is_stability_stage_c(keys: Any) -> bool:
    """Stability's layout (fused attention), as opposed to diffusers' (the stage C marker key is shared)."""
    keys = set(keys)
    return "clip_txt_mapper.weight" in keys and any(k.endswith(".attention.attn.in_proj_weight") for k in keys)


def _check(state_dict: Mapping[str, torch.Tensor], expected: set[str], found: Any, layout: str) -> None:
    missing = sorted(expected - state_dict.keys())
    extra = sorted(k for k in state_dict if found(k) and k not in expected)
    if missing or extra:
        raise ValueError(
            f"the stage C weights do not match the model config in {layout} layout: "
            f"missing {missing[:4]}{' …' if len(missing) > 4 else ''}, unexpected {extra[:4]}"
        )
