"""Tiny Stable Cascade pipelines: the prior (stage C, what OneTrainer trains) and the decoder (stages B and A).

OneTrainer also needs Stable Cascade's EfficientNet encoder, which is not a diffusers model: see
onetrainer/tiny/effnet.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from diffusers import DiffusionPipeline, StableCascadeDecoderPipeline, StableCascadePriorPipeline, StableCascadeUNet
from transformers import CLIPImageProcessor, CLIPVisionModelWithProjection

from onetrainer.tiny import components
from onetrainer.tiny.wuerstchen import build_vqgan

if TYPE_CHECKING:
    from onetrainer.tiny.reference import Config
    from onetrainer.tiny.registry import TinyVariant

# The real prior is 2048 wide throughout, conditioning included.
PRIOR_WIDTH = 32
DECODER_CONDITIONING_WIDTH = 32
IMAGE_ENCODER_WIDTH = 32


def _heads(real: Config, channels: list[int]) -> list[int]:
    # 0: no attention at that level, as in the real model.
    return [0 if n == 0 else c // components.HEAD_WIDTH for n, c in zip(real["num_attention_heads"], channels)]


def build_image_encoder(real: Config, seed: int) -> CLIPVisionModelWithProjection:
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
    width = components.TEXT_WIDTHS[real["clip_text_in_channels"]]
    config = tiny_prior_config(real, text_width=width, pooled_width=width, image_width=IMAGE_ENCODER_WIDTH)
    return components.build(config, seed, "prior")


def build_prior_pipeline(variant: TinyVariant, seed: int) -> StableCascadePriorPipeline:
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
