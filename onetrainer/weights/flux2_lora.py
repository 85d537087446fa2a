"""Flux.2 LoRA files: adapters on the diffusers transformer (peft names) ↔ the kohya layout over Black Forest Labs'
names (`lora_unet_<BFL module path>`), which ComfyUI maps onto its Flux.2 model by its generic rule and diffusers'
`Flux2Pipeline` / `Flux2KleinPipeline.load_lora_weights` reads through its kohya Flux.2 converter. The rules every
fused layout shares are `fused_transformer_lora.py`'s; this module gives them Flux.2's module map
(`flux2_keys.module_map`).

- LoRA: adapters on a double block's to_q/to_k/to_v (add_q/k/v_proj) become one exact LoRA on `img_attn_qkv`
  (`txt_attn_qkv`), block-diagonal, which diffusers' converter recognises and splits back; the single blocks are fused
  alike in both layouts (`linear1`, `linear2`). `norm_out.linear` is `final_layer_adaLN_modulation_1` with its up
  rows' halves swapped (shift|scale).
- What diffusers 0.42.1 reads of such a file: the numbered blocks' modules, img_in, txt_in, time_in and
  final_layer.linear; the modulations (`double_stream_modulation_img/txt.lin`, `single_stream_modulation.lin`),
  guidance_in and `final_layer.adaLN_modulation.1` it drops with a warning ("Unsupported keys"), so a layer filter
  that reaches them (OneTrainer's `full`) makes a file ComfyUI reads whole and diffusers in part (the family's
  `file_caveats` say so; `blocks` stays inside what both read).
- LoHa, LoKr, DoRA: each projection of a fused layer keeps its own entry, `lora_transformer_<diffusers path>`
  (OneTrainer's layout, read back here).
"""

from __future__ import annotations

from onetrainer.weights.flux2_keys import module_map, original_module
from onetrainer.weights.fused_transformer_lora import FusedLayout

TEXT_ENCODER_PREFIX = "lora_te1"
LAYOUT = FusedLayout("Flux.2", module_map, original_module)
