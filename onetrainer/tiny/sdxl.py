"""Tiny Stable Diffusion XL pipelines, text-to-image and inpainting."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from onetrainer.config.enums import ModelType
from onetrainer.tiny import reference as ref
from onetrainer.tiny.variant import TinyVariant

if TYPE_CHECKING:
    from diffusers import StableDiffusionXLPipeline

    from onetrainer.tiny.reference import Config

LISTING_ORDER = 2


def _sdxl(unet: Config) -> dict[str, Config]:
    return {
        "unet": unet,
        "vae": ref.SDXL_VAE,
        "text_encoder": ref.CLIP_L_TEXT,
        "tokenizer": ref.CLIP_TOKENIZER,
        "text_encoder_2": ref.OPEN_CLIP_BIGG_TEXT,
        "tokenizer_2": ref.OPEN_CLIP_TOKENIZER,
        "scheduler": ref.EULER_EPSILON,
    }


VARIANTS = (
    TinyVariant(
        name="sdxl",
        model_type=ModelType.STABLE_DIFFUSION_XL_10_BASE,
        pipeline_class="StableDiffusionXLPipeline",
        description="SDXL 1.0 base: CLIP-L (12 layers) + OpenCLIP-bigG with projection (32 layers), transformer "
        "depths 1/2/10, text_time added embeddings, Euler, epsilon prediction",
        module=__name__,
        references=_sdxl(ref.SDXL_UNET),
    ),
    TinyVariant(
        name="sdxl-inpainting",
        model_type=ModelType.STABLE_DIFFUSION_XL_10_BASE_INPAINTING,
        pipeline_class="StableDiffusionXLInpaintPipeline",
        description="SDXL 1.0 inpainting: sdxl with a 9-channel UNet input",
        module=__name__,
        references=_sdxl(ref.SDXL_INPAINTING_UNET),
    ),
)


def build_pipeline(variant: TinyVariant, seed: int) -> StableDiffusionXLPipeline:
    """The pipeline for `variant`, whose references name the real unet, vae, both text encoders and tokenizers, and
    scheduler."""
    from onetrainer.tiny import components
    from onetrainer.util.threads import library_attribute

    refs = variant.references
    tokenizer, text_encoder = components.build_clip_text(refs, seed)
    tokenizer_2, text_encoder_2 = components.build_clip_text(refs, seed, suffix="_2")
    vae_config = components.tiny_vae_config(refs["vae"], variant.resolution)
    unet_config = components.tiny_unet_config(
        refs["unet"],
        # The UNet attends to both encoders' hidden states, concatenated along the feature axis ...
        cross_attention_dim=text_encoder.config.hidden_size + text_encoder_2.config.hidden_size,
        sample_size=components.latent_size(vae_config, variant.resolution),
        # ... and gets the second encoder's pooled, projected output through its added embedding.
        pooled_dim=text_encoder_2.config.projection_dim,
    )
    kwargs = {}
    if variant.pipeline_class == "StableDiffusionXLInpaintPipeline":
        # The SDXL inpainting model was not trained with the refiner's aesthetic-score conditioning.
        kwargs["requires_aesthetics_score"] = False
    pipeline_class = library_attribute("diffusers", variant.pipeline_class)
    return pipeline_class(
        vae=components.build_vae(vae_config, seed),
        text_encoder=text_encoder,
        text_encoder_2=text_encoder_2,
        tokenizer=tokenizer,
        tokenizer_2=tokenizer_2,
        unet=components.build_unet(unet_config, seed),
        scheduler=components.build_scheduler(refs["scheduler"]),
        force_zeros_for_empty_prompt=True,
        # The invisible-watermark package is optional, and tests want plain, deterministic images.
        add_watermarker=False,
        **kwargs,
    )


def unet_inputs(model: Any, randn: Any) -> dict[str, Any]:
    from onetrainer.tiny.components import unet_inputs

    return unet_inputs(model, randn)


DENOISER_INPUTS = {"UNet2DConditionModel": unet_inputs}
