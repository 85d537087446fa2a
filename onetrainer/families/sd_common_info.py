"""What the declarations of SD 1.5 / 2.x and SDXL share (`sd_info.py`, `sdxl_info.py`), as `sd_common.py` holds what
their families share: torch-free."""

from __future__ import annotations

from onetrainer.config.enums import ModelFormat, TrainingMethod
from onetrainer.config.family_info import CIRCULAR_PADDING, GENERALIZED_OFFSET_NOISE, LAYER_SKIP, ZERO_TERMINAL_SNR

SD_LIKE_FORMATS = {
    TrainingMethod.FINE_TUNE: (ModelFormat.ORIGINAL_SINGLE_FILE, ModelFormat.DIFFUSERS, ModelFormat.LEGACY_SAFETENSORS),
    TrainingMethod.LORA: (ModelFormat.KOHYA_LORA, ModelFormat.DIFFUSERS_LORA, ModelFormat.LEGACY_LORA),
    TrainingMethod.EMBEDDING: (ModelFormat.SAFETENSORS,),
}
UNET_LAYER_PRESETS = {"attn-mlp": ("attentions",), "attn-only": ("attn",), "full": ()}
SD_CAPABILITIES = frozenset({CIRCULAR_PADDING, ZERO_TERMINAL_SNR, GENERALIZED_OFFSET_NOISE, LAYER_SKIP})
