"""Tiny PixArt-alpha pipeline: a DiT transformer conditioned on a T5 encoder."""

from __future__ import annotations

from typing import TYPE_CHECKING

from diffusers import PixArtAlphaPipeline

from onetrainer.tiny import components

if TYPE_CHECKING:
    from onetrainer.tiny.registry import TinyVariant

# 6 heads of 8: the width must be divisible by 3, because the timestep, resolution and aspect-ratio embeddings
# (one third of the width each for the latter two) are added together.
TRANSFORMER_HEADS = 6


def build_pipeline(variant: TinyVariant, seed: int) -> PixArtAlphaPipeline:
    """The pipeline for `variant`, whose references name the real transformer, vae, text_encoder, tokenizer and
    scheduler.

    The transformer keeps the real sample_size (128, i.e. 1024 px), which is what switches on PixArt's resolution
    micro-conditioning; sample smaller images by passing height/width and `use_resolution_binning=False`.
    """
    refs = variant.references
    tokenizer, text_encoder = components.build_t5_text(refs, seed)
    transformer_config = components.tiny_config(
        "transformer",
        refs["transformer"],
        num_attention_heads=TRANSFORMER_HEADS,
        attention_head_dim=components.HEAD_WIDTH,
        cross_attention_dim=TRANSFORMER_HEADS * components.HEAD_WIDTH,
        caption_channels=components.T5_WIDTH,
    )
    return PixArtAlphaPipeline(
        tokenizer=tokenizer,
        text_encoder=text_encoder,
        vae=components.build_vae(components.tiny_vae_config(refs["vae"], variant.resolution), seed),
        transformer=components.build(transformer_config, seed, "transformer"),
        scheduler=components.build_scheduler(refs["scheduler"]),
    )
