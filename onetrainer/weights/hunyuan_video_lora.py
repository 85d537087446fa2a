"""HunyuanVideo LoRA files: adapters on the diffusers transformer (peft names) ↔ the layouts over the original module
names (`hunyuan_video_keys.py`) that musubi-tuner, diffusion-pipe and ComfyUI use. The rules every fused layout shares
are `fused_transformer_lora.py`'s.

- KOHYA_LORA, musubi-tuner's: `lora_unet_<original path, dots as underscores>` with `.lora_down.weight`,
  `.lora_up.weight` and `.alpha`. Adapters on the projections of a fused layer (`img_attn_qkv`, `txt_attn_qkv`,
  `linear1`, a refiner block's `self_attn_qkv`) become one exact, block-diagonal LoRA on it; the final modulation's up
  rows have their halves swapped (shift|scale).
- COMFY_LORA, diffusion-pipe's (what ComfyUI maps for HunyuanVideo under `diffusion_model.` and `transformer.`, and
  diffusers' `_convert_hunyuan_video_lora_to_diffusers` reads): `diffusion_model.<original path>` with peft's
  `.lora_A.weight` / `.lora_B.weight` and no alpha, the scale alpha / rank folded into `lora_B` (the converter reads
  none; an `.alpha` entry would make it split a scalar).
- LoHa, LoKr: no exact form on a fused layer, so each projection of one (and the swapped final modulation) keeps its
  own entry under `lora_transformer_<diffusers path>` (read back by this trainer; ComfyUI maps no such name for
  HunyuanVideo); the other modules are named as LoRA's (KOHYA_LORA `lora_unet_…`, COMFY_LORA `diffusion_model.…`, with
  their `.alpha`).

What diffusers 0.42.1's converter makes of a COMFY_LORA file: the double blocks exactly; a single block's `linear1` it
splits at a hard-coded width of 3072 (the released model's: right there, wrong for another width); a refiner block's
`self_attn_qkv` it splits down and up matrices alike, which does not fit a block-diagonal LoRA (it refuses the file);
the modules outside the blocks (`txt_in`, `time_in`, `final_layer`, …) it renames without the `transformer.` prefix
and drops.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from onetrainer.weights import comfy_lora
from onetrainer.weights.adapter_kinds import LORA
from onetrainer.weights.fused_transformer_lora import Config, FusedLayout, unet_name
from onetrainer.weights.hunyuan_video_keys import module_map, original_module

LAYOUT = FusedLayout("HunyuanVideo", module_map, original_module)
COMFY_PREFIX = "diffusion_model."
# diffusion-pipe's own prefix, which ComfyUI maps as well: read, never written
READ_PREFIXES = (COMFY_PREFIX, "transformer.")
_PEFT_SUFFIXES = {"lora_A.weight": "lora_down.weight", "lora_B.weight": "lora_up.weight"}


def _original_paths(config: Config) -> dict[str, str]:
    """kohya name (`lora_unet_…`) → original module path, for every original module of the map."""
    return {unet_name(o.path): o.path for o in module_map(config).values()}


def transformer_to_comfy(
    kind: str,
    state: Mapping[str, torch.Tensor],
    alphas: Mapping[str, float] | float,
    ranks: Mapping[str, int] | None,
    config: Config,
) -> dict[str, torch.Tensor]:
    """The transformer's adapter state (peft names) → COMFY_LORA keys (diffusion-pipe's layout, see above)."""
    kohya = LAYOUT.to_kohya(kind, state, alphas, ranks, config)
    paths = _original_paths(config)
    out: dict[str, torch.Tensor] = {}
    if kind != LORA:
        for key, value in kohya.items():
            name, _, suffix = key.partition(".")
            out[f"{COMFY_PREFIX}{paths[name]}.{suffix}" if name in paths else key] = value
        return out
    for name in {key.partition(".")[0] for key in kohya}:
        down, up = kohya[f"{name}.lora_down.weight"], kohya[f"{name}.lora_up.weight"]
        scale = float(kohya[f"{name}.alpha"]) / down.shape[0]
        out[f"{COMFY_PREFIX}{paths[name]}.lora_A.weight"] = down
        out[f"{COMFY_PREFIX}{paths[name]}.lora_B.weight"] = up * scale
    return out


def comfy_to_kohya(state: Mapping[str, torch.Tensor], config: Config) -> dict[str, torch.Tensor]:
    """A COMFY_LORA (or diffusion-pipe, `transformer.`) file's transformer keys renamed to the kohya names `LAYOUT`
    reads (`.lora_A.weight` → `.lora_down.weight`, …; no alpha means alpha = rank, as there); other keys (a
    DIFFUSERS_LORA file's, a text encoder's) as they are."""
    paths = {path: name for name, path in _original_paths(config).items()}
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        prefix = next((p for p in READ_PREFIXES if key.startswith(p)), None)
        module, suffix = (None, key) if prefix is None else comfy_lora.module_and_suffix(key[len(prefix) :], paths)
        if module is None:
            out[key] = value
            continue
        out[f"{paths[module]}.{_PEFT_SUFFIXES.get(suffix, suffix)}"] = value
    return out
