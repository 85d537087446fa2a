"""Tiny Z-Image pipeline: a single-stream DiT over 2x2 patches of 16-channel latents, conditioned on the penultimate
hidden states of a Qwen3 text encoder, which reads prompts through Qwen3's chat template."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from onetrainer.tiny import components
from onetrainer.util.threads import library_attribute

if TYPE_CHECKING:
    from onetrainer.tiny.registry import TinyVariant

# 2 heads of 16: the rotary embedding splits each head's width over its three position axes (text position or frame,
# row, column), each an even number, as the real 32/48/48 split 128.
TRANSFORMER_HEADS = 2
HEAD_WIDTH = 16
ROPE_AXES = [4, 6, 6]

# Qwen3 at a tiny width, in Qwen3-4B's proportions: queries wider than the model (8 heads of 8 over 32 channels, as
# 32 x 128 over 2560), a quarter as many key/value heads (grouped-query attention), a wide MLP.
TEXT_WIDTH = 32
TEXT_HEADS = 8
TEXT_KV_HEADS = 2
TEXT_HEAD_WIDTH = 8
TEXT_MLP_WIDTH = 128


def tiny_text_encoder_config(variant: TinyVariant, tokenizer: Any) -> dict[str, Any]:
    """Qwen3 at the tiny width, with the tokenizer's vocabulary and its own start / end token ids (the real config's
    151643 / 151645 are the same tokens' ids in the full vocabulary)."""
    return components.tiny_config(
        "text_encoder",
        variant.references["text_encoder"],
        depth=variant.depths.get("text_encoder"),
        hidden_size=TEXT_WIDTH,
        intermediate_size=TEXT_MLP_WIDTH,
        num_attention_heads=TEXT_HEADS,
        num_key_value_heads=TEXT_KV_HEADS,
        head_dim=TEXT_HEAD_WIDTH,
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.pad_token_id,  # "<|endoftext|>": Qwen3's config calls it the start token
        eos_token_id=tokenizer.eos_token_id,
    )


def tiny_transformer_config(variant: TinyVariant, text_width: int) -> dict[str, Any]:
    """The transformer at the tiny width; `cap_feat_dim` is the text encoder's width, as 2560 is Qwen3-4B's."""
    return components.tiny_config(
        "transformer",
        variant.references["transformer"],
        depth=variant.depths.get("transformer"),
        dim=TRANSFORMER_HEADS * HEAD_WIDTH,
        n_heads=TRANSFORMER_HEADS,
        n_kv_heads=TRANSFORMER_HEADS,  # equal, as in the real model (its attention has no grouped heads)
        axes_dims=ROPE_AXES,
        cap_feat_dim=text_width,
    )


def build_pipeline(variant: TinyVariant, seed: int) -> Any:
    """The pipeline for `variant`: the transformer, the Qwen3 text_encoder and its tokenizer, the VAE, the
    scheduler."""
    from onetrainer.tiny.qwen_tokenizer import build_qwen_tokenizer

    refs = variant.references
    tokenizer = build_qwen_tokenizer()
    text_encoder = components.build(tiny_text_encoder_config(variant, tokenizer), seed, "text_encoder")
    config = tiny_transformer_config(variant, text_encoder.config.hidden_size)
    return library_attribute("diffusers", variant.pipeline_class)(
        transformer=components.build(config, seed, "transformer"),
        scheduler=components.build_scheduler(refs["scheduler"]),
        vae=components.build_vae(components.tiny_vae_config(refs["vae"], variant.resolution), seed),
        text_encoder=text_encoder,
        tokenizer=tokenizer,
    )
