"""Gemma-2 as a tiny text encoder, for the families that condition on it: their tiny modules build its config here."""

from __future__ import annotations

from typing import Any

from onetrainer.tiny.variant import TinyVariant

# Gemma-2 at a tiny width in Gemma-2 2B's proportions: half as many key/value heads as query heads (2 of 16 here, 8 of
# 256 there), the attention scaled by the head width (`query_pre_attn_scalar`, 256 = head_dim there), a wide MLP.
TEXT_WIDTH = 32
TEXT_HEADS = 2
TEXT_KV_HEADS = 1
TEXT_HEAD_WIDTH = 16
TEXT_MLP_WIDTH = 64
# What a tiny config of Gemma-2 changes besides the shared text encoders' widths.
GEMMA2_WIDTH_FIELDS = frozenset({"num_key_value_heads", "head_dim", "query_pre_attn_scalar"})


def tiny_gemma2_config(variant: TinyVariant, tokenizer: Any) -> dict[str, Any]:
    """The variant's Gemma-2 at the tiny width, with the tokenizer's vocabulary and its special tokens' ids (0–2, as
    the real ones')."""
    from onetrainer.tiny import components

    return components.tiny_config(
        "text_encoder",
        variant.references["text_encoder"],
        depth=variant.depths.get("text_encoder"),
        hidden_size=TEXT_WIDTH,
        intermediate_size=TEXT_MLP_WIDTH,
        num_attention_heads=TEXT_HEADS,
        num_key_value_heads=TEXT_KV_HEADS,
        head_dim=TEXT_HEAD_WIDTH,
        query_pre_attn_scalar=TEXT_HEAD_WIDTH,
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
