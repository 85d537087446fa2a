"""Mistral3 (a Mistral language model with a Pixtral vision tower) as a tiny text encoder, for the families that
condition on it (FLUX.2 [dev]'s Mistral Small 3.2, ERNIE-Image's Ministral 3 3B): their tiny modules build its config
here. The vision tower is part of the class and its checkpoint; neither family runs it for text."""

from __future__ import annotations

from typing import Any

from onetrainer.tiny.variant import TinyVariant

# The language model at a tiny width, in Mistral's proportions: queries narrower than the model (4 heads of 6 over 32
# channels, as 32 x 128 over 5120 in Mistral Small, over 3072 in Ministral 3B), a quarter as many key/value heads, a
# wide MLP. The Pixtral vision tower: 2 heads of 8 (the real 16 of 64), a 2x MLP (the real 4x).
MISTRAL_WIDTH = 32
MISTRAL_HEADS = 4
MISTRAL_KV_HEADS = 1
MISTRAL_HEAD_WIDTH = 6
MISTRAL_MLP_WIDTH = 128
PIXTRAL_WIDTH = 16
PIXTRAL_HEADS = 2
PIXTRAL_HEAD_WIDTH = 8
PIXTRAL_MLP_WIDTH = 32

# The width fields of Mistral3's nested configs (`text_config`, `vision_config`), which a tiny module declares in its
# WIDTH_FIELDS / DEPTH_FIELDS / NESTED_CONFIGS.
WIDTH_FIELDS = {
    "text_encoder": frozenset({"text_config", "vision_config"}),
    "text_config": frozenset(
        {"hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size"}
    ),
    "vision_config": frozenset({"hidden_size", "intermediate_size", "num_attention_heads", "head_dim"}),
}
DEPTH_FIELDS = {
    "text_encoder": frozenset({"text_config", "vision_config"}),
    "text_config": frozenset({"num_hidden_layers"}),
    "vision_config": frozenset({"num_hidden_layers"}),
}
NESTED_CONFIGS = frozenset({"text_config", "vision_config"})


def tiny_mistral3_config(variant: TinyVariant, tokenizer: Any) -> dict[str, Any]:
    """The variant's Mistral3 text encoder at the tiny width, with the tokenizer's vocabulary (its control tokens keep
    their real ids: `image_token_index` stays 10, `[IMG]`)."""
    from onetrainer.tiny import components

    return components.tiny_config(
        "text_encoder",
        variant.references["text_encoder"],
        depth=variant.depths.get("text_encoder"),
        text_config={
            "hidden_size": MISTRAL_WIDTH,
            "intermediate_size": MISTRAL_MLP_WIDTH,
            "num_attention_heads": MISTRAL_HEADS,
            "num_key_value_heads": MISTRAL_KV_HEADS,
            "head_dim": MISTRAL_HEAD_WIDTH,
            "vocab_size": len(tokenizer),
        },
        vision_config={
            "hidden_size": PIXTRAL_WIDTH,
            "intermediate_size": PIXTRAL_MLP_WIDTH,
            "num_attention_heads": PIXTRAL_HEADS,
            "head_dim": PIXTRAL_HEAD_WIDTH,
        },
    )
