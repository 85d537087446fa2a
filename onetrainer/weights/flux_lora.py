"""Flux.1 and Chroma LoRA files: adapters on the diffusers transformer (peft names) ↔ the kohya layout over the
original (Black Forest Labs) names that ComfyUI, Forge and sd-scripts read, and diffusers'
`FluxPipeline.load_lora_weights` (`ChromaPipeline`'s too) in part. The rules every fused layout shares are
`fused_transformer_lora.py`'s; this module gives them Flux's module map (`flux_keys.module_map`) and its quirks.

- LoRA: transformer modules are `lora_unet_<original module path, dots as underscores>`. Adapters on a double block's
  to_q/to_k/to_v (add_q/k/v_proj) and on a single block's to_q/to_k/to_v/proj_mlp become one exact LoRA on
  `img_attn_qkv` (`txt_attn_qkv`, `linear1`, whose slices are unequal: 3 × width + 4 × width), block-diagonal;
  diffusers' converter recognises the structure and splits it back (or, for unequal ranks, gives every projection the
  whole down matrix: exact too). `norm_out.linear` is `final_layer_adaLN_modulation_1` with the up rows' halves
  swapped (shift|scale). The two `final_layer` modules get their scale alpha / rank folded into the up matrix and
  alpha = rank: diffusers' converter reads no alpha for them (its "TODO: alphas"), ComfyUI does, and so both add the
  same ΔW.
- LoHa, LoKr, DoRA: each projection of a fused layer, and the final modulation, keeps its own entry,
  `lora_transformer_<diffusers module path>`: ComfyUI maps these names onto the projection's rows of the fused
  weight (`comfy.utils.flux_to_diffusers`, used for Flux and for Chroma, a subclass) and applies any kind on that
  slice alone, which is exact; it also swaps the ΔW halves of `lora_transformer_norm_out_linear`. diffusers loads none
  of these kinds for Flux (it drops `dora_scale` with a warning and converts no LoHa/LoKr key).

What diffusers 0.42.1 makes of a kohya Flux file: only the numbered blocks' modules reach the transformer. Its
converter returns img_in, txt_in, time/vector/guidance_in and final_layer without the `transformer.` prefix, and
`load_lora_weights` drops them without a word; a `lora_unet_` name it does not know (Chroma's
`distilled_guidance_layer`, which ComfyUI maps like every weight of its model) makes it refuse the whole file
(`diffusers_refused`). sd-scripts trains `linear1` as one LoRA with a shared down matrix: it reads exactly.

Text encoders (the family names their modules with `kohya_lora.kohya_module_name(prefix, path)`): Flux's CLIP-L is
`lora_te1_`, read by diffusers (only where the attention's out_proj has an entry too: it tells its layout by
`to_out_lora`), ComfyUI and Forge. Flux's T5 is `lora_te3_` as sd-scripts writes it; ComfyUI and Forge read it and
OneTrainer's `lora_te2_`, diffusers drops both without a word. Chroma's only encoder, T5, is `lora_te1_` (ComfyUI
numbers T5 after the CLIPs the model has; OneTrainer's LEGACY_LORA wrote `lora_te_`); diffusers' ChromaPipeline
reads it as a CLIP and refuses the file ("Could not automatically infer state dict type").
"""

from __future__ import annotations

from collections.abc import Iterable

from onetrainer.weights.flux_keys import module_map, original_module
from onetrainer.weights.fused_transformer_lora import FusedLayout

CLIP_PREFIX = "lora_te1"
T5_PREFIX = "lora_te3"
T5_READ_PREFIXES = ("lora_te3", "lora_te2")  # sd-scripts, OneTrainer
CHROMA_T5_PREFIX = "lora_te1"
CHROMA_T5_READ_PREFIXES = ("lora_te1", "lora_te")  # kohya / ComfyUI, OneTrainer's legacy layout

# Modules whose kohya entries diffusers' Flux/Chroma LoRA loader refuses (the whole file, not only the entry).
_DIFFUSERS_REFUSED = ("distilled_guidance_layer.",)

# diffusers' kohya converter ignores the final layer's alphas: with alpha = rank (scale 1) every consumer adds the same
# ΔW.
LAYOUT = FusedLayout("Flux/Chroma", module_map, original_module, fold_scale=("final_layer.",))

transformer_kohya_names = LAYOUT.kohya_names
transformer_kohya_name = LAYOUT.kohya_name
transformer_to_kohya = LAYOUT.to_kohya
kohya_to_transformer = LAYOUT.from_kohya

__all__ = [
    "CHROMA_T5_PREFIX",
    "CHROMA_T5_READ_PREFIXES",
    "CLIP_PREFIX",
    "LAYOUT",
    "T5_PREFIX",
    "T5_READ_PREFIXES",
    "diffusers_refused",
    "kohya_to_transformer",
    "transformer_kohya_name",
    "transformer_kohya_names",
    "transformer_to_kohya",
]


def diffusers_refused(module_paths: Iterable[str]) -> list[str]:
    """The modules among `module_paths` whose entries make diffusers' loader refuse the file (Chroma's
    `distilled_guidance_layer`), for a warning where a layer filter includes them."""
    return sorted(m for m in module_paths if m.startswith(_DIFFUSERS_REFUSED))
