"""Tiny Flux.1 Kontext [dev] pipeline: Flux.1 dev's tiny transformer, text encoders and VAE in a FluxKontextPipeline
folder (the real Kontext transformer has FLUX.1-dev's config: the reference's tokens join the image's, no extra
channels)."""

from __future__ import annotations

from typing import Any

from onetrainer.config.enums import ModelType
from onetrainer.tiny import flux
from onetrainer.tiny import reference as ref
from onetrainer.tiny.variant import TinyVariant

LISTING_ORDER = 11  # the order the tiny models were added in

VARIANTS = (
    TinyVariant(
        name="flux-kontext",
        model_type=ModelType.FLUX_KONTEXT_DEV_1,
        pipeline_class="FluxKontextPipeline",
        description="FLUX.1-Kontext-dev: flux-dev (2 + 2 of the real 19 + 38 blocks, a guidance embedding, CLIP-L + "
        "T5 v1.1 XXL, 16-channel VAE, flow-matching Euler with a resolution-dependent shift) taking one reference "
        "image's packed latents after the image's tokens",
        module=__name__,
        references={
            "transformer": ref.FLUX_DEV_TRANSFORMER,
            "vae": ref.FLUX_VAE,
            "text_encoder": ref.CLIP_L_TEXT,
            "tokenizer": ref.CLIP_TOKENIZER,
            "text_encoder_2": ref.T5_XXL_ENCODER,
            "tokenizer_2": ref.T5_TOKENIZER,
            "scheduler": ref.FLOW_MATCH_EULER_DYNAMIC,
        },
        depths=flux.FLUX_DEPTH,
    ),
)


def build_pipeline(variant: TinyVariant, seed: int) -> Any:
    """Flux.1's tiny pipeline, as a FluxKontextPipeline (the variant's `pipeline_class`)."""
    return flux.build_pipeline(variant, seed)
