"""Flux.1 and Chroma LoRA files: adapters on the diffusers transformer (peft names) ↔ the kohya layout over the
original (Black Forest Labs) names that ComfyUI, Forge and sd-scripts read, and diffusers'
`FluxPipeline.load_lora_weights` (`ChromaPipeline`'s too) in part.

Transformer modules are `lora_unet_<original module path, dots as underscores>` (`flux_keys.module_map`):

- LoRA: adapters on a double block's to_q/to_k/to_v (add_q/k/v_proj) and on a single block's to_q/to_k/to_v/proj_mlp
  become one exact LoRA on `img_attn_qkv` (`txt_attn_qkv`, `linear1`, whose slices are unequal: 3 × width + 4 ×
  width), block-diagonal (`fused_lora.py`); diffusers' converter recognises the structure and splits it back (or, for
  unequal ranks, gives every projection the whole down matrix: exact too). `norm_out.linear` is
  `final_layer_adaLN_modulation_1` with the up rows' halves swapped (shift|scale). The two `final_layer` modules get
  their scale alpha / rank folded into the up matrix and alpha = rank: diffusers' converter reads no alpha for them (its
  "TODO: alphas"), ComfyUI does, and so both add the same ΔW.
- LoHa, LoKr, DoRA: their ΔW has no exact form on a fused layer (a Hadamard or Kronecker product does not stack into
  one, a DoRA norm over the fused rows is not the projections'), so each projection of a fused layer keeps its own
  entry, named `lora_transformer_<diffusers module path>` (OneTrainer's own layout): ComfyUI maps these names onto the
  projection's rows of the fused weight (`comfy.utils.flux_to_diffusers`, used for Flux and for Chroma, a subclass)
  and applies any kind on that slice alone, which is exact; it also swaps the ΔW halves of
  `lora_transformer_norm_out_linear`. The other modules keep `lora_unet_<original>`. diffusers loads none of these
  kinds for Flux (it drops `dora_scale` with a warning and converts no LoHa/LoKr key).

What diffusers 0.42.1 makes of a kohya Flux file: only the numbered blocks' modules reach the transformer. Its
converter returns img_in, txt_in, time/vector/guidance_in and final_layer without the `transformer.` prefix, and
`load_lora_weights` drops them without a word; a `lora_unet_` name it does not know (Chroma's
`distilled_guidance_layer`, which ComfyUI maps like every weight of its model) makes it refuse the whole file
(`diffusers_refused`).

Reading takes both namespaces for every kind; a LoRA on a fused layer splits into per-projection adapters when
block-diagonal (ours), or, trained on the fused layer itself with one shared down matrix (sd-scripts' `linear1`),
as one adapter per projection with that whole down matrix and its own up rows: exact, at the file's rank.

Text encoders (the family names their modules with `kohya_lora.kohya_module_name(prefix, path)`): Flux's CLIP-L is
`lora_te1_`, read by diffusers (only where the attention's out_proj has an entry too: it tells its layout by
`to_out_lora`), ComfyUI and Forge. Flux's T5 is `lora_te3_` as sd-scripts writes it; ComfyUI and Forge read it and
OneTrainer's `lora_te2_`, diffusers drops both without a word. Chroma's only encoder, T5, is `lora_te1_` (ComfyUI
numbers T5 after the CLIPs the model has; OneTrainer's LEGACY_LORA wrote `lora_te_`); diffusers' ChromaPipeline
reads it as a CLIP and refuses the file ("Could not automatically infer state dict type").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from onetrainer.weights import kohya_lora, lycoris_keys
from onetrainer.weights.adapter_kinds import LORA
from onetrainer.weights.flux_keys import OriginalModule, module_map, original_module, swap_halves
from onetrainer.weights.fused_lora import Adapter, fuse, peft_pairs, split
from onetrainer.weights.kohya_lora import LORA_A, LORA_B

TRANSFORMER_PREFIX = "lora_unet"
# OneTrainer's diffusers-named layout: LyCORIS kinds' entries for the projections of fused layers (read for any kind).
DIFFUSERS_NAMED_PREFIX = "lora_transformer"
CLIP_PREFIX = "lora_te1"
T5_PREFIX = "lora_te3"
T5_READ_PREFIXES = ("lora_te3", "lora_te2")  # sd-scripts, OneTrainer
CHROMA_T5_PREFIX = "lora_te1"
CHROMA_T5_READ_PREFIXES = ("lora_te1", "lora_te")  # kohya / ComfyUI, OneTrainer's legacy layout

# Modules whose kohya entries diffusers' Flux/Chroma LoRA loader refuses (the whole file, not only the entry).
_DIFFUSERS_REFUSED = ("distilled_guidance_layer.",)
_FINAL_LAYER = "final_layer."


@dataclass
class TransformerAdapters:
    """The transformer's adapters read from a file: peft-style weights by diffusers module, alpha and rank per module,
    LoKr structure, the file keys used, and the module names under our prefixes this transformer does not have."""

    weights: dict[str, torch.Tensor] = field(default_factory=dict)
    alphas: dict[str, float] = field(default_factory=dict)
    ranks: dict[str, int] = field(default_factory=dict)
    structure: dict = field(default_factory=dict)
    used: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)


def transformer_kohya_names(config: Mapping[str, Any]) -> dict[str, str]:
    """Every adaptable transformer module (diffusers path) → its name in a file of a LyCORIS kind, and for LoRA where it
    is a whole original module: `lora_unet_<original path>`; for a slice of a fused layer and the swapped final
    modulation `lora_transformer_<diffusers path>` (LoRA writes those fused / swapped under `lora_unet_` itself)."""
    return {module: _kohya_name(module, original) for module, original in module_map(config).items()}


def transformer_kohya_name(module_path: str, config: Mapping[str, Any]) -> str:
    """One module's name (`transformer_kohya_names`); a module the transformer does not have gets its diffusers
    path under `lora_transformer_`."""
    return _kohya_name(module_path, original_module(module_path, config))


def _kohya_name(module_path: str, original: OriginalModule | None) -> str:
    if original is None or original.fused or original.swapped:
        return kohya_lora.kohya_module_name(DIFFUSERS_NAMED_PREFIX, module_path)
    return kohya_lora.kohya_module_name(TRANSFORMER_PREFIX, original.path)


def is_transformer_key(key: str) -> bool:
    """Whether a LoRA file key belongs to the transformer (either namespace)."""
    return key.startswith((TRANSFORMER_PREFIX + "_", DIFFUSERS_NAMED_PREFIX + "_"))


def diffusers_refused(module_paths: Iterable[str]) -> list[str]:
    """The modules among `module_paths` whose entries make diffusers' loader refuse the file (Chroma's
    `distilled_guidance_layer`), for a warning where a layer filter includes them."""
    return sorted(m for m in module_paths if m.startswith(_DIFFUSERS_REFUSED))


def transformer_to_kohya(
    kind: str,
    state: Mapping[str, torch.Tensor],
    alphas: Mapping[str, float] | float,
    ranks: Mapping[str, int] | None,
    config: Mapping[str, Any],
) -> dict[str, torch.Tensor]:
    """The transformer's adapter state (peft names, `<module>.lora_A.weight` …) → kohya / LyCORIS keys. `alphas`: one
    alpha or one per module; `ranks` per module (needed for the LyCORIS kinds; LoRA reads them off the weights)."""
    if kind == LORA:
        return _lora_to_kohya(state, alphas, config)
    if ranks is None:
        raise ValueError(f"the ranks are needed to write a {kind} file")
    per_module = dict.fromkeys(ranks, float(alphas)) if isinstance(alphas, int | float) else alphas
    names = transformer_kohya_names(config)

    def name_of(module: str) -> str:
        if module not in names:
            raise KeyError(f"no Flux/Chroma module {module} for its {kind} adapter")
        return names[module]

    return lycoris_keys.to_kohya(kind, state, name_of, per_module, ranks)


def kohya_to_transformer(
    kind: str, state: Mapping[str, torch.Tensor], config: Mapping[str, Any]
) -> TransformerAdapters:
    """The transformer's keys of a kohya / LyCORIS file (`lora_unet_…`, `lora_transformer_…`; other keys are left
    alone) → per-projection adapters. ValueError where a fused LoRA does not split, or a LyCORIS kind is on a fused
    layer."""
    mine = {k: v for k, v in state.items() if is_transformer_key(k)}
    if kind == LORA:
        return _lora_from_kohya(mine, config)
    fused = {_unet_name(o.path) for o in module_map(config).values() if o.fused}
    for key in mine:
        if key.partition(".")[0] in fused:
            raise ValueError(
                f"{key.partition('.')[0]}: a {kind} adapter on the fused layer cannot be split into the projections "
                "this trainer adapts"
            )
    module_of = {name: module for module, name in transformer_kohya_names(config).items()}
    module_of |= {kohya_lora.kohya_module_name(DIFFUSERS_NAMED_PREFIX, m): m for m in module_map(config)}
    weights, alphas, ranks, structure, unknown = lycoris_keys.from_kohya(kind, mine, module_of)
    used = [k for k in mine if k.partition(".")[0] in module_of]
    return TransformerAdapters(weights, alphas, ranks, structure, used, unknown)


def _unet_name(original_path: str) -> str:
    return kohya_lora.kohya_module_name(TRANSFORMER_PREFIX, original_path)


def _alpha(alphas: Mapping[str, float] | float, module: str) -> float:
    return float(alphas if isinstance(alphas, int | float) else alphas[module])


def _lora_to_kohya(
    state: Mapping[str, torch.Tensor], alphas: Mapping[str, float] | float, config: Mapping[str, Any]
) -> dict[str, torch.Tensor]:
    originals = module_map(config)
    groups: dict[str, dict[int, Adapter]] = {}
    rows_of: dict[str, tuple[int, ...]] = {}
    for module, (down, up) in peft_pairs(state).items():
        original = originals.get(module)
        if original is None:
            raise KeyError(f"no Flux/Chroma module {module} for its LoRA")
        alpha = _alpha(alphas, module)
        if original.swapped:
            up = swap_halves(up)
        if original.path.startswith(_FINAL_LAYER):
            # diffusers' kohya converter ignores the final layer's alphas: with alpha = rank (scale 1) every consumer
            # adds the same ΔW.
            rank = down.shape[0]
            up, alpha = up * (alpha / rank), float(rank)
        groups.setdefault(original.path, {})[original.index] = (down, up, alpha)
        rows_of[original.path] = original.rows or (up.shape[0],)

    out: dict[str, torch.Tensor] = {}
    for path, adapters in groups.items():
        down, up, alpha = fuse(adapters, rows_of[path])
        name = _unet_name(path)
        out[f"{name}.lora_down.weight"] = down
        out[f"{name}.lora_up.weight"] = up
        out[f"{name}.alpha"] = torch.tensor(alpha)
    return out


def _lora_from_kohya(mine: Mapping[str, torch.Tensor], config: Mapping[str, Any]) -> TransformerAdapters:
    groups: dict[str, list[tuple[str, OriginalModule]]] = {}
    for module, original in module_map(config).items():
        groups.setdefault(_unet_name(original.path), []).append((module, original))
        groups[kohya_lora.kohya_module_name(DIFFUSERS_NAMED_PREFIX, module)] = [(module, OriginalModule(module))]

    downs: dict[str, torch.Tensor] = {}
    ups: dict[str, torch.Tensor] = {}
    alphas: dict[str, float] = {}
    result = TransformerAdapters()
    unknown: set[str] = set()
    for key, value in mine.items():
        name, _, suffix = key.partition(".")
        if name not in groups:
            unknown.add(name)
            continue
        if suffix == "lora_down.weight":
            downs[name] = value
        elif suffix == "lora_up.weight":
            ups[name] = value
        elif suffix == "alpha":
            alphas[name] = float(value.item())
        else:
            unknown.add(key)
            continue
        result.used.append(key)

    for name, down in downs.items():
        if name not in ups:
            raise ValueError(f"{name} has lora_down but no lora_up")
        up, rank = ups[name], down.shape[0]
        alpha = alphas.get(name, float(rank))  # kohya's convention: no alpha means alpha = rank
        modules = sorted(groups[name], key=lambda item: item[1].index)
        original = modules[0][1]
        if original.fused:
            parts = split(name, down, up, alpha, original.rows, share_down=True)
        else:
            parts = [(down, swap_halves(up) if original.swapped else up, alpha)]
        for (module, _), part in zip(modules, parts):
            if part is None:
                continue  # this projection had no adapter
            if module in result.ranks:
                raise ValueError(f"{name}: a second LoRA for {module} in the same file")
            part_down, part_up, part_alpha = part
            result.weights[module + LORA_A] = part_down
            result.weights[module + LORA_B] = part_up
            result.alphas[module] = part_alpha
            result.ranks[module] = int(part_down.shape[0])
    result.unknown = sorted(unknown)
    return result
