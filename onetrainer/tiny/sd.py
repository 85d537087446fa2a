"""Tiny Stable Diffusion 1.x and 2.x pipelines, text-to-image and inpainting."""

from __future__ import annotations

from typing import TYPE_CHECKING

from diffusers import StableDiffusionPipeline

from onetrainer.tiny import components
from onetrainer.util.threads import library_attribute

if TYPE_CHECKING:
    from onetrainer.tiny.registry import TinyVariant


def build_pipeline(variant: TinyVariant, seed: int) -> StableDiffusionPipeline:
    """The pipeline for `variant`, whose references name the real unet, vae, text_encoder, tokenizer, scheduler."""
    refs = variant.references
    tokenizer, text_encoder = components.build_clip_text(refs, seed)
    vae_config = components.tiny_vae_config(refs["vae"], variant.resolution)
    unet_config = components.tiny_unet_config(
        refs["unet"],
        cross_attention_dim=text_encoder.config.hidden_size,
        sample_size=components.latent_size(vae_config, variant.resolution),
    )
    # StableDiffusionPipeline or StableDiffusionInpaintPipeline: they take the same parts.
    pipeline_class = library_attribute("diffusers", variant.pipeline_class)
    return pipeline_class(
        vae=components.build_vae(vae_config, seed),
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        unet=components.build_unet(unet_config, seed),
        scheduler=components.build_scheduler(refs["scheduler"]),
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
