"""Tiny Stable Diffusion 3 and 3.5 pipelines: joint (MMDiT) transformer blocks over 2x2 patches of 16-channel latents,
conditioned on CLIP-L and CLIP-G (hidden states and projected pooled outputs) and T5."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from onetrainer.tiny import components
from onetrainer.util.threads import library_attribute

if TYPE_CHECKING:
    from onetrainer.tiny.registry import TinyVariant

TRANSFORMER_HEADS = 2
HEAD_WIDTH = 16
# The CLIPs' hidden states (32 + 64 wide here) are zero-padded to T5's width and joined along the sequence: T5 must be
# at least as wide as both together, as the real 4096 is wider than 768 + 1280.
T5_WIDTH = 128
# Position table side in patches (192 in the real models, 384 for 3.5 Medium): up to 256 px here.
POSITION_SIDE = 16


def tiny_transformer_config(variant: TinyVariant, pooled_width: int) -> dict[str, Any]:
    real = variant.references["transformer"]
    return components.tiny_config(
        "transformer",
        real,
        depth=variant.depths.get("transformer"),
        num_attention_heads=TRANSFORMER_HEADS,
        attention_head_dim=HEAD_WIDTH,
        caption_projection_dim=TRANSFORMER_HEADS * HEAD_WIDTH,  # the transformer's width, as in the real models
        joint_attention_dim=T5_WIDTH,
        pooled_projection_dim=pooled_width,
        pos_embed_max_size=POSITION_SIDE,
    )


def build_pipeline(variant: TinyVariant, seed: int) -> Any:
    """The pipeline for `variant`: CLIP-L (text_encoder), CLIP-G (text_encoder_2), T5 (text_encoder_3), their
    tokenizers, the transformer, the VAE and the scheduler."""
    refs = variant.references
    tokenizer, text_encoder = components.build_clip_text(refs, seed)
    with torch.no_grad():  # SD 3's CLIP-L projects its pooled output with the identity (its files hold none)
        text_encoder.text_projection.weight.copy_(torch.eye(text_encoder.config.hidden_size))
    tokenizer_2, text_encoder_2 = components.build_clip_text(refs, seed, suffix="_2")
    tokenizer_3, text_encoder_3 = components.build_t5_text(refs, seed, suffix="_3", width=T5_WIDTH)
    pooled = text_encoder.config.projection_dim + text_encoder_2.config.projection_dim
    transformer = components.build(tiny_transformer_config(variant, pooled), seed, "transformer")
    return library_attribute("diffusers", variant.pipeline_class)(
        transformer=transformer,
        scheduler=components.build_scheduler(refs["scheduler"]),
        vae=components.build_vae(components.tiny_vae_config(refs["vae"], variant.resolution), seed),
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        text_encoder_2=text_encoder_2,
        tokenizer_2=tokenizer_2,
        text_encoder_3=text_encoder_3,
        tokenizer_3=tokenizer_3,
    )
