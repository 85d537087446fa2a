"""Adapter weights between peft-style names and the kohya / LyCORIS layout AUTOMATIC1111, Forge and ComfyUI load.

Module names are kohya's (`lora_unet_…`, `lora_te1_…`); the weight names are LyCORIS's:

- LoRA: `lora_down.weight`, `lora_up.weight`, `.alpha`; DoRA adds `dora_scale` ([1, in] by default, [out, 1] on
  the output axis — the consumers tell the axis from the shape).
- LoHa: `hada_w1_a`, `hada_w1_b`, `hada_w2_a`, `hada_w2_b`, `.alpha`; ΔW = (w1_a·w1_b) ⊙ (w2_a·w2_b) · alpha/rank.
- LoKr: `lokr_w1` or `lokr_w1_a/_b`, `lokr_w2` or `lokr_w2_a/_b` (+ `lokr_t2`), `.alpha`; ΔW = w1 ⊗ w2 · alpha/rank.
  The consumers apply alpha/rank only when a factor is decomposed (the rank is the `_b` factor's first side);
  with both factors full they apply scale 1, so the scale is folded into `lokr_w1` and no alpha is written.
  With `lokr_weight_decompose`, `dora_scale` beside them ([out, 1] on the output axis, LyCORIS's default; [1, in]
  otherwise): AUTOMATIC1111 applies it only per input column, ComfyUI both ways (normalising the output-axis variant
  by the base weight alone, so its result differs slightly there).
- OFT v2 (peft's OFT, OneTrainer's `OFT_2`): `oft_R.weight`, the blocks' skew-symmetric parameters as peft keeps
  them. Only OneTrainer and this trainer load it; upstream ComfyUI and AUTOMATIC1111 load LyCORIS OFT
  (`oft_blocks`), a different adapter (rotating the output side), so no conversion is offered. Scaled OFT
  (`oft_scaled`) adds `oft_R.scaled_oft` (true), as OneTrainer writes it: the parameters are divided by
  2·√(block size − 1) before use.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import torch

from onetrainer.weights.adapter_kinds import DORA, LOHA, LOKR, LORA, OFT

# peft-style weight name → LyCORIS name, per kind.
_NAMES = {
    LORA: {"lora_A.weight": "lora_down.weight", "lora_B.weight": "lora_up.weight"},
    DORA: {"lora_A.weight": "lora_down.weight", "lora_B.weight": "lora_up.weight", "dora_scale": "dora_scale"},
    LOHA: {k: k for k in ("hada_w1_a", "hada_w1_b", "hada_w2_a", "hada_w2_b")},
    LOKR: {
        k: k
        for k in ("lokr_w1", "lokr_w1_a", "lokr_w1_b", "lokr_w2", "lokr_w2_a", "lokr_w2_b", "lokr_t2", "dora_scale")
    },
    OFT: {"oft_R.weight": "oft_R.weight", "oft_R.scaled_oft": "oft_R.scaled_oft"},
}
_HAS_ALPHA = {LORA, DORA, LOHA, LOKR}


def _split(key: str, names: Mapping[str, str]) -> tuple[str, str] | None:
    for suffix in names:
        if key.endswith("." + suffix):
            return key[: -len(suffix) - 1], suffix
    return None


def to_kohya(
    kind: str,
    state: Mapping[str, torch.Tensor],
    name_of: Callable[[str], str],
    alphas: Mapping[str, float],
    ranks: Mapping[str, int],
) -> dict[str, torch.Tensor]:
    """One part's adapter state (peft-style names) → LyCORIS keys under kohya module names."""
    names = _NAMES[kind]
    modules: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in state.items():
        split = _split(key, names)
        if split is None:
            raise KeyError(f"not a {kind} adapter weight: {key}")
        modules.setdefault(split[0], {})[split[1]] = value
    out: dict[str, torch.Tensor] = {}
    for module, weights in modules.items():
        name = name_of(module)
        alpha = float(alphas.get(module, ranks.get(module, 1)))
        write_alpha = kind in _HAS_ALPHA
        if kind == LOKR and "lokr_w1" in weights and "lokr_w2" in weights:
            # Both factors full: consumers use scale 1, so the scale goes into the weights.
            weights = {**weights, "lokr_w1": weights["lokr_w1"] * (alpha / ranks[module])}
            write_alpha = False
        for suffix, value in weights.items():
            out[f"{name}.{names[suffix]}"] = value
        if write_alpha:
            out[f"{name}.alpha"] = torch.tensor(alpha)
    return out


def detect_kind(state: Mapping[str, torch.Tensor]) -> str | None:
    """The adapter kind of a kohya / LyCORIS file, from its weight names; None when it holds none we know."""
    suffixes = {key.partition(".")[2] for key in state}
    if "dora_scale" in suffixes and "lora_down.weight" in suffixes:
        return DORA
    for kind, marker in ((LORA, "lora_down.weight"), (LOHA, "hada_w1_a"), (LOKR, "lokr_w1"), (OFT, "oft_R.weight")):
        if marker in suffixes or (kind == LOKR and "lokr_w1_a" in suffixes):
            return kind
    return None


def from_kohya(
    kind: str, state: Mapping[str, torch.Tensor], module_of: Mapping[str, str]
) -> tuple[dict[str, torch.Tensor], dict[str, float], dict[str, int], dict, list[str]]:
    """LyCORIS keys of one part → (peft-style weights, alpha per module, rank per module, LoKr structure,
    names this model does not have). `module_of` maps kohya module names to module paths."""
    inverse = {v: k for k, v in _NAMES[kind].items()}
    weights: dict[str, torch.Tensor] = {}
    alphas: dict[str, float] = {}
    per_module: dict[str, dict[str, torch.Tensor]] = {}
    unknown: set[str] = set()
    for key, value in state.items():
        name, _, suffix = key.partition(".")
        module = module_of.get(name)
        if module is None:
            unknown.add(name)
        elif suffix == "alpha":
            alphas[module] = float(value.item())
        elif suffix in inverse:
            per_module.setdefault(module, {})[inverse[suffix]] = value
        else:
            unknown.add(key)
    ranks: dict[str, int] = {}
    structure: dict = {}
    for module, tensors in per_module.items():
        ranks[module] = _rank(kind, tensors)
        if kind == LOKR:
            if "lokr_w1" in tensors and "lokr_w2" in tensors:
                alphas[module] = float(ranks[module])  # the scale is folded in: alpha = rank gives scale 1
            structure["decompose_both"] = structure.get("decompose_both", False) or "lokr_w1_a" in tensors
            structure["use_tucker"] = structure.get("use_tucker", False) or "lokr_t2" in tensors
        for suffix, value in tensors.items():
            weights[f"{module}.{suffix}"] = value
    for module, rank in ranks.items():
        alphas.setdefault(module, float(rank))  # kohya's convention: no alpha means alpha = rank
    return weights, alphas, ranks, structure, sorted(unknown)


def _rank(kind: str, tensors: Mapping[str, torch.Tensor]) -> int:
    if kind in (LORA, DORA):
        return int(tensors["lora_A.weight"].shape[0])
    if kind == LOHA:
        return int(tensors["hada_w1_b"].shape[0])
    if kind == LOKR:
        if "lokr_t2" in tensors:  # Tucker: w2_a is [rank, out], w2_b [rank, in], t2 [rank, rank, kh, kw]
            return int(tensors["lokr_t2"].shape[0])
        if "lokr_w2_a" in tensors:
            return int(tensors["lokr_w2_a"].shape[1])
        if "lokr_w1_a" in tensors:
            return int(tensors["lokr_w1_a"].shape[1])
        w1, w2 = tensors["lokr_w1"], tensors["lokr_w2"]
        return max(int(w1.shape[0] * w2.shape[0]), int(w1.shape[1] * w2.shape[1]))
    # OFT: the block size, from the number of skew-symmetric parameters per block (n·(n−1)/2).
    count = int(tensors["oft_R.weight"].shape[-1])
    return round((1 + math.sqrt(1 + 8 * count)) / 2)
