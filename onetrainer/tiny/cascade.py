"""Tiny Stable Cascade pipelines: the prior (stage C, what OneTrainer trains) and the decoder (stages B and A).

OneTrainer also needs Stable Cascade's EfficientNet encoder, which is not a diffusers model: see
onetrainer/tiny/effnet.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from onetrainer.config.enums import ModelType
from onetrainer.tiny import reference as ref
from onetrainer.tiny.variant import TinyVariant
from onetrainer.tiny.wuerstchen import (
    CASCADE_RESOLUTION,
    DECODER_LATENT,
    OWN_PARTS,
    PRIOR_LATENT,
    build_vqgan,
    own_part,
)

if TYPE_CHECKING:
    from diffusers import (
        DiffusionPipeline,
        StableCascadeDecoderPipeline,
        StableCascadePriorPipeline,
        StableCascadeUNet,
    )
    from transformers import CLIPVisionModelWithProjection

    from onetrainer.tiny.reference import Config

LISTING_ORDER = 9
# The decoder's VQGAN is Würstchen's, named as in the hub's folder.
MODEL_INDEX_ENTRIES = {"PaellaVQModel": ["wuerstchen", "PaellaVQModel"]}

# The real prior is 2048 wide throughout, conditioning included.
PRIOR_WIDTH = 32
DECODER_CONDITIONING_WIDTH = 32
IMAGE_ENCODER_WIDTH = 32
WIDTH_FIELDS = {
    "prior": frozenset(
        {
            "block_out_channels",
            "num_attention_heads",
            "conditioning_dim",
            "clip_text_in_channels",
            "clip_text_pooled_in_channels",
            "clip_image_in_channels",
        }
    ),
    "decoder": frozenset(
        {"block_out_channels", "num_attention_heads", "conditioning_dim", "clip_text_pooled_in_channels"}
    ),
}

VARIANTS = (
    TinyVariant(
        name="cascade",
        model_type=ModelType.STABLE_CASCADE_1,
        pipeline_class="StableCascadePriorPipeline",
        description="Stable Cascade prior (stage C, like stabilityai/stable-cascade-prior): 8+24 blocks, "
        "OpenCLIP-bigG with projection (32 layers), CLIP-L image encoder; its decoder is cascade-decoder",
        module=__name__,
        references={
            "prior": ref.CASCADE_PRIOR_UNET,
            "text_encoder": ref.OPEN_CLIP_BIGG_TEXT,
            "tokenizer": ref.OPEN_CLIP_TOKENIZER,
            "image_encoder": ref.CLIP_L_VISION,
            "scheduler": ref.DDPM_WUERSTCHEN,
        },
        resolution=CASCADE_RESOLUTION,
        own_parts=OWN_PARTS,
    ),
    TinyVariant(
        name="cascade-decoder",
        model_type=ModelType.STABLE_CASCADE_1,
        pipeline_class="StableCascadeDecoderPipeline",
        description="Stable Cascade decoder (stages B and A, like stabilityai/stable-cascade): blocks 2/6/28/6, "
        "OpenCLIP-bigG with projection (32 layers), Paella VQGAN",
        module=__name__,
        references={
            "decoder": ref.CASCADE_DECODER_UNET,
            "vqgan": ref.PAELLA_VQGAN,
            "text_encoder": ref.OPEN_CLIP_BIGG_TEXT,
            "tokenizer": ref.OPEN_CLIP_TOKENIZER,
            "scheduler": ref.DDPM_WUERSTCHEN,
        },
        resolution=CASCADE_RESOLUTION,
    ),
)


def _heads(real: Config, channels: list[int]) -> list[int]:
    from onetrainer.tiny import components

    # 0: no attention at that level, as in the real model.
    return [0 if n == 0 else c // components.HEAD_WIDTH for n, c in zip(real["num_attention_heads"], channels)]


def build_image_encoder(real: Config, seed: int) -> CLIPVisionModelWithProjection:
    from onetrainer.tiny import components

    config = components.tiny_config(
        "image_encoder",
        real,
        hidden_size=IMAGE_ENCODER_WIDTH,
        intermediate_size=IMAGE_ENCODER_WIDTH * 2,
        num_attention_heads=components.TEXT_HEADS,
        projection_dim=IMAGE_ENCODER_WIDTH,
    )
    return components.build(config, seed, "image_encoder")


def tiny_prior_config(real: Config, text_width: int, pooled_width: int, image_width: int) -> Config:
    """A stage C config (3.6B or lite) at the tiny width, with the given conditioning widths."""
    from onetrainer.tiny import components

    channels = [PRIOR_WIDTH] * len(real["block_out_channels"])
    return components.tiny_config(
        "prior",
        real,
        block_out_channels=channels,
        num_attention_heads=_heads(real, channels),
        conditioning_dim=PRIOR_WIDTH,
        clip_text_in_channels=text_width,
        clip_text_pooled_in_channels=pooled_width,
        clip_image_in_channels=image_width,
    )


def build_prior_unet(real: Config, seed: int = 0) -> StableCascadeUNet:
    """A tiny stage C alone (no pipeline), e.g. from the lite config, for key-layout tests."""
    from onetrainer.tiny import components

    width = components.TEXT_WIDTHS[real["clip_text_in_channels"]]
    config = tiny_prior_config(real, text_width=width, pooled_width=width, image_width=IMAGE_ENCODER_WIDTH)
    return components.build(config, seed, "prior")


def build_prior_pipeline(variant: TinyVariant, seed: int) -> StableCascadePriorPipeline:
    from diffusers import StableCascadePriorPipeline
    from transformers import CLIPImageProcessor

    from onetrainer.tiny import components

    refs = variant.references
    tokenizer, text_encoder = components.build_clip_text(refs, seed)
    image_encoder = build_image_encoder(refs["image_encoder"], seed)
    config = tiny_prior_config(
        refs["prior"],
        text_width=text_encoder.config.hidden_size,
        pooled_width=text_encoder.config.projection_dim,
        image_width=image_encoder.config.projection_dim,
    )
    return StableCascadePriorPipeline(
        tokenizer=tokenizer,
        text_encoder=text_encoder,
        prior=components.build(config, seed, "prior"),
        scheduler=components.build_scheduler(refs["scheduler"]),
        # The real prior ships transformers' default CLIP preprocessing (224 px, OpenAI mean/std).
        feature_extractor=CLIPImageProcessor(),
        image_encoder=image_encoder,
    )


def build_decoder_pipeline(variant: TinyVariant, seed: int) -> StableCascadeDecoderPipeline:
    from diffusers import StableCascadeDecoderPipeline

    from onetrainer.tiny import components

    refs = variant.references
    tokenizer, text_encoder = components.build_clip_text(refs, seed)
    channels = components.tiny_channels(refs["decoder"]["block_out_channels"])
    config = components.tiny_config(
        "decoder",
        refs["decoder"],
        block_out_channels=channels,
        num_attention_heads=_heads(refs["decoder"], channels),
        conditioning_dim=DECODER_CONDITIONING_WIDTH,
        clip_text_pooled_in_channels=text_encoder.config.projection_dim,
    )
    return StableCascadeDecoderPipeline(
        decoder=components.build(config, seed, "decoder"),
        tokenizer=tokenizer,
        text_encoder=text_encoder,
        scheduler=components.build_scheduler(refs["scheduler"]),
        vqgan=build_vqgan(refs["vqgan"], seed),
    )


def build_pipeline(variant: TinyVariant, seed: int) -> DiffusionPipeline:
    if "prior" in variant.references:
        return build_prior_pipeline(variant, seed)
    return build_decoder_pipeline(variant, seed)


def build_own_part(variant: TinyVariant, part: str) -> Path:
    """The local path of a part the base `variant` brings itself (`OWN_PARTS`), built once into the cache."""
    return own_part(variant, part, wuerstchen=False)


def unet_inputs(model: Any, randn: Any) -> dict[str, Any]:
    """Stage C (no effnet input: the text, its pooled output and the image embedding) or stage B (the pooled text
    and stage C's latents) at 128 px; the time as a fraction of the schedule."""
    import torch

    from onetrainer.tiny.denoiser_step import TIME_FRACTIONS

    config = model.config
    is_prior = config.effnet_in_channels is None
    inputs = {
        "sample": randn(2, config.in_channels, *(PRIOR_LATENT if is_prior else DECODER_LATENT)),
        "timestep_ratio": torch.tensor(TIME_FRACTIONS),
        "clip_text_pooled": randn(2, 1, config.clip_text_pooled_in_channels),
    }
    if is_prior:
        inputs["clip_text"] = randn(2, 77, config.clip_text_in_channels)
        inputs["clip_img"] = randn(2, 1, config.clip_image_in_channels)
    else:
        inputs["effnet"] = randn(2, config.effnet_in_channels, *PRIOR_LATENT)
    return inputs


DENOISER_INPUTS = {"StableCascadeUNet": unet_inputs}
