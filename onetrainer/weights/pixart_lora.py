"""PixArt LoRA files: adapters on the diffusers transformer (peft names) ↔ kohya's layout over PixArt's native names
(`pixart_keys.module_map`), the names ComfyUI maps for PixArt. The rules are `fused_transformer_lora.py`'s, shared
with Flux and SD 3:

- LoRA: transformer modules are `lora_unet_<native module path>`. Natively, self-attention's q/k/v are one `attn.qkv`
  layer and cross-attention's k/v one `cross_attn.kv_linear`, so separate adapters on to_q/to_k/to_v (to_k/to_v)
  are written as one exact block-diagonal LoRA on the fused layer (`fused_lora.fuse`: with equal alpha / rank for
  the parts, alpha is their sum and rank the sum of ranks, otherwise each part's scale is folded into its up block
  and alpha = rank).
- LoHa, LoKr, DoRA, OFT: no exact fused form, so each projection of a fused layer keeps its own entry under its
  diffusers path, `lora_unet_<diffusers module path>` (PixArt's files have always named them so; OneTrainer alone
  reads them); whole modules keep `lora_unet_<native path>`.

Reading reverses this where a fused LoRA is block-diagonal (ours, or any with that structure); a LoRA trained on the
fused layer itself mixes the projections and is refused (`share_down=False`). T5 is `lora_te1_<module path>`, the
generic layout.
"""

from __future__ import annotations

from onetrainer.weights import kohya_lora
from onetrainer.weights.fused_transformer_lora import TRANSFORMER_PREFIX, FusedLayout
from onetrainer.weights.pixart_keys import module_map, original_module

TEXT_ENCODER_PREFIX = "lora_te1"

LAYOUT = FusedLayout("PixArt", module_map, original_module, diffusers_prefix=TRANSFORMER_PREFIX, share_down=False)


def text_encoder_kohya_name(module_path: str) -> str:
    return kohya_lora.kohya_module_name(TEXT_ENCODER_PREFIX, module_path)
