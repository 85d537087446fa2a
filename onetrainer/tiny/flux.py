"""Tiny Flux.1 (dev, schnell, Fill) and Chroma pipelines: double- and single-stream transformer blocks over packed
16-channel latents, conditioned on T5 (and, for Flux, CLIP-L's pooled output)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from onetrainer.tiny import components
from onetrainer.util.threads import library_attribute

if TYPE_CHECKING:
    from onetrainer.tiny.registry import TinyVariant

# 2 heads of 16: the rotary embedding splits each head's width over its three position axes (unused, row, column),
# each an even number, as the real 16/56/56 split 128.
TRANSFORMER_HEADS = 2
HEAD_WIDTH = 16
ROPE_AXES = [4, 6, 6]
APPROXIMATOR_WIDTH = 32  # Chroma's modulation network (5120 wide in the real model)


def tiny_transformer_config(variant: TinyVariant, pooled_width: int | None) -> dict[str, Any]:
    real = variant.references["transformer"]
    widths: dict[str, Any] = {
        "num_attention_heads": TRANSFORMER_HEADS,
        "attention_head_dim": HEAD_WIDTH,
        "axes_dims_rope": ROPE_AXES,
        "joint_attention_dim": components.T5_WIDTH,
    }
    if "pooled_projection_dim" in real:  # Flux: CLIP-L's pooled output
        widths["pooled_projection_dim"] = pooled_width
    if "approximator_hidden_dim" in real:  # Chroma
        widths["approximator_hidden_dim"] = APPROXIMATOR_WIDTH
    return components.tiny_config("transformer", real, depth=variant.depths.get("transformer"), **widths)


def build_pipeline(variant: TinyVariant, seed: int) -> Any:
    """The pipeline for `variant`: Flux's references name the transformer, vae, CLIP text_encoder and tokenizer, T5
    text_encoder_2 and tokenizer_2, and the scheduler; Chroma's name one T5 text_encoder and tokenizer."""
    refs = variant.references
    vae = components.build_vae(components.tiny_vae_config(refs["vae"], variant.resolution), seed)
    scheduler = components.build_scheduler(refs["scheduler"])
    pipeline_class = library_attribute("diffusers", variant.pipeline_class)
    if "text_encoder_2" not in refs:  # Chroma: T5 alone
        tokenizer, text_encoder = components.build_t5_text(refs, seed)
        transformer = components.build(tiny_transformer_config(variant, None), seed, "transformer")
        return pipeline_class(
            scheduler=scheduler, vae=vae, text_encoder=text_encoder, tokenizer=tokenizer, transformer=transformer
        )
    tokenizer, text_encoder = components.build_clip_text(refs, seed)
    tokenizer_2, text_encoder_2 = components.build_t5_text(refs, seed, suffix="_2")
    config = tiny_transformer_config(variant, text_encoder.config.hidden_size)
    return pipeline_class(
        scheduler=scheduler,
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        text_encoder_2=text_encoder_2,
        tokenizer_2=tokenizer_2,
        transformer=components.build(config, seed, "transformer"),
    )
