"""Tiny Lumina-Image 2.0 pipeline: a unified DiT (caption and image tokens in one sequence, each refined first by
blocks of its own) over 2x2 patches of Flux's 16-channel VAE latents, conditioned on Gemma-2's second-to-last hidden
states, which reads prompts after Lumina's system prompt."""

from __future__ import annotations

from typing import Any

from onetrainer.config.enums import ModelType
from onetrainer.tiny import reference as ref
from onetrainer.tiny.gemma2_text import GEMMA2_WIDTH_FIELDS, TEXT_WIDTH, tiny_gemma2_config
from onetrainer.tiny.variant import TinyVariant

LISTING_ORDER = 15  # the order the tiny models were added in

# The transformer: 3 query heads of 12 sharing 1 key/value head (as 24 of 96 share 8), the rotary axes 4/4/4 over
# (caption position, row, column) as 32/32/32 split 96, its SwiGLU rounded up to a multiple of 16 (the real 256).
TRANSFORMER_HEADS = 3
TRANSFORMER_KV_HEADS = 1
HEAD_WIDTH = 12
ROPE_AXES = [4, 4, 4]
MULTIPLE_OF = 16

WIDTH_FIELDS = {
    "transformer": frozenset({"hidden_size", "num_kv_heads", "axes_dim_rope", "multiple_of", "cap_feat_dim"}),
    "text_encoder": GEMMA2_WIDTH_FIELDS,
}
# Lumina 2's 26 joint blocks as 2 (its 2 + 2 refiner blocks stay: the released layout names both); Gemma-2 2B's 26
# layers as 3: the pipeline reads the second-to-last layer's output, so two layers feed the transformer and the last
# one's output goes unused, as in the real model.
DEPTH_FIELDS = {"transformer": frozenset({"num_layers"}), "text_encoder": frozenset({"num_hidden_layers"})}
LUMINA2_DEPTH = {"transformer": {"num_layers": 2}, "text_encoder": {"num_hidden_layers": 3}}

VARIANTS = (
    TinyVariant(
        name="lumina2",
        model_type=ModelType.LUMINA_2,
        pipeline_class="Lumina2Pipeline",
        description="Lumina-Image 2.0 (Alpha-VLLM/Lumina-Image-2.0): unified DiT blocks (2 of the real 26, after 2 + 2 "
        "refiner blocks for the image and the caption) with grouped-query attention and 3D rotary positions, Gemma-2 "
        "2B (3 of 26 layers, its second-to-last hidden states, prompts after Lumina's system prompt), 16-channel Flux "
        "VAE, flow-matching Euler at shift 6; CFG with its normalisation",
        module=__name__,
        references={
            "transformer": ref.LUMINA2_TRANSFORMER,
            "vae": ref.FLUX_VAE,
            "text_encoder": ref.GEMMA2_2B_TEXT,
            "tokenizer": ref.GEMMA_TOKENIZER,
            "scheduler": ref.LUMINA2_SCHEDULER,
        },
        depths=LUMINA2_DEPTH,
    ),
)


def tiny_transformer_config(variant: TinyVariant) -> dict[str, Any]:
    from onetrainer.tiny import components

    return components.tiny_config(
        "transformer",
        variant.references["transformer"],
        depth=variant.depths.get("transformer"),
        hidden_size=TRANSFORMER_HEADS * HEAD_WIDTH,
        num_attention_heads=TRANSFORMER_HEADS,
        num_kv_heads=TRANSFORMER_KV_HEADS,
        axes_dim_rope=ROPE_AXES,
        multiple_of=MULTIPLE_OF,
        cap_feat_dim=TEXT_WIDTH,
    )


def build_pipeline(variant: TinyVariant, seed: int) -> Any:
    """The pipeline for `variant`: the transformer, Gemma-2 and its tokenizer, the VAE, the scheduler."""
    from onetrainer.families.lumina2 import SYSTEM_PROMPT
    from onetrainer.tiny import components
    from onetrainer.tiny.gemma_tokenizer import build_gemma_tokenizer
    from onetrainer.util.threads import library_attribute

    refs = variant.references
    tokenizer = build_gemma_tokenizer(SYSTEM_PROMPT)
    text_encoder = components.build(tiny_gemma2_config(variant, tokenizer), seed, "text_encoder")
    return library_attribute("diffusers", variant.pipeline_class)(
        transformer=components.build(tiny_transformer_config(variant), seed, "transformer"),
        scheduler=components.build_scheduler(refs["scheduler"]),
        vae=components.build_vae(components.tiny_vae_config(refs["vae"], variant.resolution), seed),
        text_encoder=text_encoder,
        tokenizer=tokenizer,
    )


def transformer_inputs(model: Any, randn: Any) -> dict[str, Any]:
    """8x8 latents (64 px) after captions of 12 tokens, the second's last 5 padding (masked). The time runs from 0
    (noise) to 1 (image)."""
    import torch

    from onetrainer.tiny.denoiser_step import TIME_FRACTIONS

    config = model.config
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, 7:] = 0
    return {
        "hidden_states": randn(2, config.in_channels, 8, 8),
        "timestep": torch.tensor(TIME_FRACTIONS),
        "encoder_hidden_states": randn(2, 12, config.cap_feat_dim),
        "encoder_attention_mask": mask,
    }


DENOISER_INPUTS = {"Lumina2Transformer2DModel": transformer_inputs}
