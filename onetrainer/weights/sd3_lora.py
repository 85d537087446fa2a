"""Stable Diffusion 3 / 3.5 LoRA files: adapters on the diffusers transformer (peft names) ↔ sd-scripts' kohya layout
over Stability AI's module names, which ComfyUI and sd-scripts read. The rules are `fused_transformer_lora.py`'s
over SD 3's module map (`sd3_keys.module_map`):

- LoRA: `lora_unet_<SAI module path, dots as underscores>`: `joint_blocks_N_x_block_attn_qkv` (to_q/to_k/to_v as
  one exact block-diagonal LoRA), `joint_blocks_N_context_block_attn_qkv` (add_q/k/v_proj), 3.5 Medium's
  `joint_blocks_N_x_block_attn2_qkv`, `…_attn_proj`, `…_mlp_fc1/fc2`, `…_adaLN_modulation_1`, `context_embedder`,
  `x_embedder_proj` (the patch convolution), `t_embedder_mlp_0/2`, `y_embedder_mlp_0/2`, `final_layer_linear`,
  `final_layer_adaLN_modulation_1`. ComfyUI maps every `lora_unet_X` onto `diffusion_model.X.weight` and adds
  alpha / rank · up · down there; the final modulation's and the last block's text modulation's up rows are stored
  shift|scale, as those weights are.
- LoHa, LoKr, DoRA: the projections of a fused q/k/v and the two swapped modulations keep one entry each,
  `lora_transformer_<diffusers path>`, which ComfyUI maps onto their rows of the fused weight (and whose ΔW halves it
  swaps) through `comfy.utils.mmdit_to_diffusers`.

diffusers 0.42.1 has no kohya converter for SD 3: `StableDiffusion3Pipeline.load_lora_weights` takes only keys under
`transformer.` / `text_encoder.` / `text_encoder_2.`, so it loads nothing of such a file (no error, a warning in its
log). Text encoders keep the family's generic names (`lora_te1_` CLIP-L, `lora_te2_` CLIP-G, `lora_te3_` T5), as
sd-scripts writes them.
"""

from __future__ import annotations

from onetrainer.weights.fused_transformer_lora import FusedLayout
from onetrainer.weights.sd3_keys import module_map, original_module

# `LAYOUT.to_kohya` / `from_kohya` / `kohya_name(s)`: no consumer ignores an alpha here, so no scale is folded.
LAYOUT = FusedLayout("Stable Diffusion 3", module_map, original_module)
