"""Lumina 2's COMFY_LORA: a LoRA over the modules of the released layout (ComfyUI's model, `weights/lumina2_keys`),
under `diffusion_model.`, as `lora_A` / `lora_B` with the scale alpha / rank folded into `lora_B` (no alpha entry).

ComfyUI's generic rule applies `diffusion_model.<module>` to the weight of that module, any module of its model, so
the fused `attention.qkv` takes one LoRA: adapters on q, k and v become one exact block-diagonal LoRA on it
(`fused_lora.fuse`, rows q | k | v with k and v as wide as the key/value heads). ComfyUI's own diffusers-name map for
this model (Z-Image's) slices q/k/v at equal widths, which Lumina 2's narrower k and v do not have: the fused form is
the one both read right. diffusers' `Lumina2Pipeline.load_lora_weights` reads the same file (its converter shares the
fused down matrix among q, k, v and splits the up rows, which this block-diagonal form gives exactly) where the file
adapts every linear layer of each block (the `blocks` preset): its converter takes nothing less, nor an alpha.

LoHa and LoKr have no exact form on a fused layer: in such a file q, k and v keep their own entries under their
diffusers paths (which only this trainer reads), the other modules their released names.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from onetrainer.weights.fused_lora import fuse, peft_pairs, split
from onetrainer.weights.kohya_lora import LORA_A, LORA_B
from onetrainer.weights.lumina2_keys import released_name

PREFIX = "diffusion_model."
_PROJECTIONS = ("to_q", "to_k", "to_v")
DOWN_SUFFIXES = (LORA_A, ".lora_down.weight")
UP_SUFFIXES = (LORA_B, ".lora_up.weight")


def released_module(path: str) -> tuple[str, int | None]:
    """A diffusers module path's module in the released layout and, for q/k/v, its slice of the fused `qkv`."""
    block, dot, rest = path.partition(".attn.")
    if dot and rest in _PROJECTIONS:
        return f"{block}.attention.qkv", _PROJECTIONS.index(rest)
    return released_name(path + ".weight").removesuffix(".weight"), None


def comfy_path(path: str) -> str:
    """A module's name in a COMFY_LORA file, without the prefix: its released name, q/k/v their own diffusers paths
    (the LyCORIS kinds' entries; a LoRA's are fused instead)."""
    module, index = released_module(path)
    return path if index is not None else module


def to_comfy(
    state: Mapping[str, torch.Tensor], alphas: Mapping[str, float], rows: tuple[int, int, int]
) -> dict[str, torch.Tensor]:
    """The transformer's LoRA (peft names over diffusers modules) as COMFY_LORA: released names, q/k/v fused
    (`rows`: q's, k's and v's output widths), the scale folded into lora_B."""
    fused: dict[str, dict[int, tuple]] = {}
    out: dict[str, torch.Tensor] = {}
    for module, (down, up) in peft_pairs(state).items():
        rank = down.shape[0]
        up = up * (alphas.get(module, rank) / rank)
        name, index = released_module(module)
        if index is None:
            out[f"{PREFIX}{name}{LORA_A}"], out[f"{PREFIX}{name}{LORA_B}"] = down, up
        else:
            fused.setdefault(name, {})[index] = (down, up, float(rank))
    for name, adapters in fused.items():
        down, up, alpha = fuse(adapters, rows)
        out[f"{PREFIX}{name}{LORA_A}"], out[f"{PREFIX}{name}{LORA_B}"] = down, up * (alpha / down.shape[0])
    return out


def from_comfy(
    state: Mapping[str, torch.Tensor], modules: Mapping[str, str], rows: tuple[int, int, int]
) -> dict[str, torch.Tensor]:
    """A COMFY_LORA file's plain-LoRA entries (lora_A/lora_B or lora_down/lora_up, alpha optional) renamed to the kohya
    names of `modules` ({diffusers module path: kohya name}), a fused qkv LoRA split into q, k and v (exact: a
    block-diagonal one into its blocks, one with a shared down matrix as that matrix with each one's up rows); other
    keys as they are."""
    by_released: dict[str, str] = {}
    for path in modules:
        name, index = released_module(path)
        by_released[name if index is None else f"{name}#{index}"] = path
    out: dict[str, torch.Tensor] = {}
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in state.items():
        suffix = next((s for s in (*DOWN_SUFFIXES, *UP_SUFFIXES, ".alpha") if key.endswith(s)), None)
        name = key[len(PREFIX) : -len(suffix)] if key.startswith(PREFIX) and suffix else None
        if name is None or (name not in by_released and f"{name}#0" not in by_released):
            out[key] = value
            continue
        role = "down" if suffix in DOWN_SUFFIXES else "up" if suffix in UP_SUFFIXES else "alpha"
        pairs.setdefault(name, {})[role] = value
    for name, pair in pairs.items():
        if "down" not in pair and "up" not in pair:  # another kind's alpha (LoHa, LoKr): the generic reading's
            out[f"{PREFIX}{name}.alpha"] = pair["alpha"]
            continue
        if "down" not in pair or "up" not in pair:
            raise ValueError(f"{PREFIX}{name}: a LoRA needs both its down and up matrices")
        down, up = pair["down"], pair["up"]
        alpha = float(pair["alpha"]) if "alpha" in pair else float(down.shape[0])
        if name in by_released:
            adapters = {by_released[name]: (down, up, alpha)}
        else:
            parts = split(f"{PREFIX}{name}", down, up, alpha, rows, share_down=True)
            adapters = {by_released[f"{name}#{i}"]: a for i, a in enumerate(parts) if a is not None}
        for path, (part_down, part_up, part_alpha) in adapters.items():
            kohya = modules[path]
            out[f"{kohya}.lora_down.weight"], out[f"{kohya}.lora_up.weight"] = part_down, part_up
            out[f"{kohya}.alpha"] = torch.tensor(part_alpha)
    return out
