"""What other tools make of the LoRA files several families write, as `FileCaveat`s their declarations carry
(torch-free). ComfyUI maps a DIFFUSERS_LORA file's CLIP text encoders (`text_encoder.text_model.…`, comfy/lora.py's
model_lora_keys_clip) and drops every other text encoder's keys."""

from __future__ import annotations

from onetrainer.config.enums import ModelFormat
from onetrainer.config.family_info import FileCaveat

_COMFY_DROPS_TEXT_ENCODER = "ComfyUI drops it (it maps a DIFFUSERS_LORA file's CLIP text encoders only)"


def text_encoder_caveat(part: str, why: str) -> FileCaveat:
    """A DIFFUSERS_LORA file's LoRA on the `part`, a text encoder other than CLIP: `why` says what diffusers makes of
    it, and ComfyUI drops it."""
    return FileCaveat(ModelFormat.DIFFUSERS_LORA, f"{why}; {_COMFY_DROPS_TEXT_ENCODER}", part)
