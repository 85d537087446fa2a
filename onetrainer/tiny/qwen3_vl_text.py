"""Qwen3-VL as a tiny text encoder, for the families that condition on it (on its 4B or 8B): their tiny modules build
its config here and add its width fields to their own."""

from __future__ import annotations

from typing import Any

from onetrainer.tiny.variant import TinyVariant

# The decoder at a tiny width: 4 query heads of 8 over 32 channels sharing one key/value head (as 32 share 8), a 2x
# MLP (the real 3.8x of the 4B, 3x of the 8B); the interleaved multimodal rotary sections 2/1/1 over each head's 4
# frequency pairs, as 24/20/20 over 64.
TEXT_WIDTH = 32
TEXT_HEADS = 4
TEXT_KV_HEADS = 1
TEXT_HEAD_WIDTH = 8
TEXT_MLP_WIDTH = 64
MROPE_SECTION = [2, 1, 1]
# The vision tower (never run for text): 2 heads of 8, a 2x MLP, its merged tokens at the decoder's width.
VISION_WIDTH = 16
VISION_HEADS = 2
VISION_MLP_WIDTH = 32

WIDTH_FIELDS = {
    "text_encoder": frozenset(
        {"image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id", "text_config"}
    ),
    "text_config": frozenset(
        {
            "hidden_size",
            "intermediate_size",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "rope_parameters",
            "vocab_size",
            "bos_token_id",
            "eos_token_id",
        }
    ),
}
NESTED_CONFIGS = frozenset({"text_config"})
# The special tokens the config names by id, in the tokenizer's vocabulary.
_TOKEN_IDS = (
    ("image_token_id", "<|image_pad|>"),
    ("video_token_id", "<|video_pad|>"),
    ("vision_start_token_id", "<|vision_start|>"),
    ("vision_end_token_id", "<|vision_end|>"),
)


def tiny_qwen3_vl_config(variant: TinyVariant, tokenizer: Any) -> dict[str, Any]:
    """The variant's Qwen3-VL text encoder (at `variant.depths["text_encoder"]`) at the tiny width, with the
    tokenizer's vocabulary and its ids of the start / end and vision tokens (the real config's 151643... are the same
    tokens' ids in the full vocabulary)."""
    from onetrainer.tiny import components

    real = variant.references["text_encoder"]
    ids = {name: tokenizer.convert_tokens_to_ids(token) for name, token in _TOKEN_IDS}
    return components.tiny_config(
        "text_encoder",
        real,
        depth=variant.depths.get("text_encoder"),
        text_config={
            "hidden_size": TEXT_WIDTH,
            "intermediate_size": TEXT_MLP_WIDTH,
            "num_attention_heads": TEXT_HEADS,
            "num_key_value_heads": TEXT_KV_HEADS,
            "head_dim": TEXT_HEAD_WIDTH,
            "rope_parameters": {**real["text_config"]["rope_parameters"], "mrope_section": MROPE_SECTION},
            "vocab_size": len(tokenizer),
            "bos_token_id": tokenizer.pad_token_id,  # "<|endoftext|>": the config calls it the start token
            "eos_token_id": tokenizer.eos_token_id,
        },
        vision_config={
            "hidden_size": VISION_WIDTH,
            "intermediate_size": VISION_MLP_WIDTH,
            "num_heads": VISION_HEADS,
            "out_hidden_size": TEXT_WIDTH,
        },
        **ids,
    )
