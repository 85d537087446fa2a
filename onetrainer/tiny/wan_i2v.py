"""Tiny Wan 2.1 I2V pipeline (image to video): Wan 2.1's tiny DiT with 36 input channels (noisy latents, 4 mask
channels, the start image's latents) and image cross-attention to a tiny CLIP vision encoder's states, UMT5, Wan's
causal video VAE; sampled with UniPC on flow sigmas."""

from __future__ import annotations

from typing import Any

from onetrainer.config.enums import ModelType
from onetrainer.tiny import reference as ref
from onetrainer.tiny.variant import TinyVariant

LISTING_ORDER = 18.5  # added right after Wan 2.1 / 2.2's

# The image encoder: OpenCLIP ViT-H/14's vision tower at 32 channels (4 heads of 8), 2 of its 32 layers, at its real
# 224 px and 14 px patches (257 states: the penultimate layer's condition the transformer).
IMAGE_ENCODER_WIDTH = 32
WIDTH_FIELDS = {"transformer": frozenset({"image_dim", "added_kv_proj_dim"})}
DEPTH_FIELDS = {"image_encoder": frozenset({"num_hidden_layers"})}

VARIANTS = (
    TinyVariant(
        name="wan21-i2v",
        model_type=ModelType.WAN_2_1_I2V,
        pipeline_class="WanImageToVideoPipeline",
        description="Wan 2.1 I2V 14B (Wan-AI/Wan2.1-I2V-14B-480P-Diffusers): Wan 2.1's 3-D DiT (2 of the real 40 "
        "blocks) over the noisy latents, 4 mask channels and the start image's latents (36 channels), with image "
        "cross-attention to a CLIP ViT-H/14 vision encoder (2 of 32 layers) beside UMT5-XXL (2 of 24 layers); "
        "UniPC on flow sigmas",
        module=__name__,
        references={
            "transformer": ref.WAN21_I2V_14B_TRANSFORMER,
            "vae": ref.WAN_VAE,
            "text_encoder": ref.UMT5_XXL_ENCODER,
            "tokenizer": ref.UMT5_TOKENIZER,
            "image_encoder": ref.OPEN_CLIP_H_VISION,
            "image_processor": ref.CLIP_IMAGE_PROCESSOR,
            "scheduler": ref.WAN_SCHEDULER,
        },
        depths={
            "transformer": {"num_layers": 2},
            "text_encoder": {"num_layers": 2},
            "image_encoder": {"num_hidden_layers": 2},
        },
    ),
)


def build_image_encoder(variant: TinyVariant, seed: int) -> Any:
    from onetrainer.tiny import components

    config = components.tiny_config(
        "image_encoder",
        variant.references["image_encoder"],
        depth=variant.depths.get("image_encoder"),
        hidden_size=IMAGE_ENCODER_WIDTH,
        intermediate_size=IMAGE_ENCODER_WIDTH * 2,
        num_attention_heads=components.TEXT_HEADS,
    )
    return components.build(config, seed, "image_encoder")


def build_pipeline(variant: TinyVariant, seed: int) -> Any:
    """The pipeline: the transformer with image cross-attention, UMT5 and its tokenizer, the VAE, the CLIP vision
    encoder and its processor, the UniPC sampler."""
    from transformers import CLIPImageProcessor

    from onetrainer.tiny import components
    from onetrainer.tiny import wan as tiny_wan
    from onetrainer.util.threads import library_attribute

    refs = variant.references
    tokenizer, text_encoder = tiny_wan.build_text_encoder(variant, seed)
    transformer = components.tiny_config(
        "transformer",
        refs["transformer"],
        depth=variant.depths.get("transformer"),
        num_attention_heads=tiny_wan.TRANSFORMER_HEADS,
        attention_head_dim=tiny_wan.HEAD_WIDTH,
        ffn_dim=tiny_wan.FFN_WIDTH,
        text_dim=components.T5_WIDTH,
        image_dim=IMAGE_ENCODER_WIDTH,
        added_kv_proj_dim=tiny_wan.TRANSFORMER_HEADS * tiny_wan.HEAD_WIDTH,
    )
    vae = components.tiny_config("vae", refs["vae"], base_dim=tiny_wan.VAE_BASE_WIDTH)
    processor = {k: v for k, v in refs["image_processor"].items() if k != "image_processor_type"}
    return library_attribute("diffusers", variant.pipeline_class)(
        transformer=components.build(transformer, seed, "transformer"),
        scheduler=components.build_scheduler(refs["scheduler"]),
        vae=components.build(vae, seed, "vae"),
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        image_encoder=build_image_encoder(variant, seed),
        image_processor=CLIPImageProcessor(**processor),
    )
