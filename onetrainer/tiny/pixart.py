"""Tiny PixArt-alpha pipeline: a DiT transformer conditioned on a T5 encoder."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from onetrainer.config.enums import ModelType
from onetrainer.tiny import reference as ref
from onetrainer.tiny.variant import TinyVariant

if TYPE_CHECKING:
    from diffusers import PixArtAlphaPipeline

LISTING_ORDER = 3

# 6 heads of 8: the width must be divisible by 3, because the timestep, resolution and aspect-ratio embeddings
# (one third of the width each for the latter two) are added together.
TRANSFORMER_HEADS = 6
WIDTH_FIELDS = {"transformer": frozenset({"cross_attention_dim", "caption_channels"})}

VARIANTS = (
    TinyVariant(
        name="pixart",
        model_type=ModelType.PIXART_ALPHA,
        pipeline_class="PixArtAlphaPipeline",
        description="PixArt-alpha XL-2 1024-MS: 28-layer DiT with resolution micro-conditioning (sample_size stays "
        "128: pass height/width and use_resolution_binning=False), T5 v1.1 XXL encoder (24 layers), DPM-Solver++",
        module=__name__,
        references={
            "transformer": ref.PIXART_ALPHA_TRANSFORMER,
            "vae": ref.SD_VAE,
            "text_encoder": ref.T5_XXL_ENCODER,
            "tokenizer": ref.T5_TOKENIZER,
            "scheduler": ref.DPM_SOLVER_PIXART,
        },
    ),
)


def build_pipeline(variant: TinyVariant, seed: int) -> PixArtAlphaPipeline:
    """The pipeline for `variant`, whose references name the real transformer, vae, text_encoder, tokenizer and
    scheduler.

    The transformer keeps the real sample_size (128, i.e. 1024 px), which is what switches on PixArt's resolution
    micro-conditioning; sample smaller images by passing height/width and `use_resolution_binning=False`.
    """
    from diffusers import PixArtAlphaPipeline

    from onetrainer.tiny import components

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


def transformer_inputs(model: Any, randn: Any) -> dict[str, Any]:
    """8x8 latents (64 px), 120 T5 tokens, resolution micro-conditioning."""
    import torch

    from onetrainer.tiny.denoiser_step import TIMESTEPS

    config = model.config
    return {
        "hidden_states": randn(2, config.in_channels, 8, 8),
        "timestep": torch.tensor(TIMESTEPS),
        "encoder_hidden_states": randn(2, 120, config.caption_channels),
        "added_cond_kwargs": {"resolution": torch.tensor([[64.0, 64.0]] * 2), "aspect_ratio": torch.ones(2, 1)},
    }


DENOISER_INPUTS = {"PixArtTransformer2DModel": transformer_inputs}
