"""Tiny HunyuanVideo 1.5 pipeline (text to video): a dual-stream DiT over 1x1 patches of the 32-channel latents of its
causal video VAE (16x spatial, 4x temporal), conditioned on Qwen2.5-VL's decoder (the pipeline's chat template, its
third-last hidden states) and the ByT5 glyph encoder; flow-matching Euler with classifier-free guidance."""

from __future__ import annotations

from typing import Any

from onetrainer.config.enums import ModelType
from onetrainer.tiny import reference as ref
from onetrainer.tiny.reference import Config
from onetrainer.tiny.variant import TinyVariant

LISTING_ORDER = 21  # the order the tiny models were added in

# The transformer: 2 heads of 16 (the real 16 of 128); the rotary embedding splits a head over (frames, rows,
# columns) as 4/6/6 (the real 16/56/56). Its image-embedding input (SigLIP's 1152 in the real model, zeros for text to
# video) at 8.
TRANSFORMER_HEADS = 2
HEAD_WIDTH = 16
ROPE_AXES = [4, 6, 6]
IMAGE_EMBED_WIDTH = 8
# The VAE's level widths (the real 128 … 1024), each twice the one before but the last, as there; 5 levels keep its 16x
# spatial compression.
VAE_CHANNELS = [8, 16, 32, 64, 64]
# The glyph encoder: ByT5 at the tiny T5 width (the real 1472), 2 of its 12 layers.
GLYPH_WIDTH = 32

WIDTH_FIELDS = {
    "transformer": frozenset({"rope_axes_dim", "text_embed_dim", "text_embed_2_dim", "image_embed_dim"}),
}
DEPTH_FIELDS = {"transformer": frozenset({"num_layers"})}

# 2 of the real 54 dual-stream blocks (the token refiner's 2 stay); Qwen2.5-VL's 28 decoder layers as 3 (the pipeline
# reads the third-last hidden states: the first layer's output); ByT5's 12 encoder layers as 2.
DEPTHS = {
    "transformer": {"num_layers": 2},
    "text_encoder": {"num_hidden_layers": 3},
    "text_encoder_2": {"num_layers": 2},
}

VARIANTS = (
    TinyVariant(
        name="hunyuan-video15",
        model_type=ModelType.HUNYUAN_VIDEO_15,
        pipeline_class="HunyuanVideo15Pipeline",
        description="HunyuanVideo 1.5 T2V 480p (hunyuanvideo-community/HunyuanVideo-1.5-Diffusers-480p_t2v): a "
        "dual-stream DiT (2 of the real 54 blocks, its 2-block token refiner) over 1x1 patches of its causal video "
        "VAE's 32-channel latents (16x spatial, 4x temporal; clips of 4k + 1 frames), conditioned on Qwen2.5-VL-7B's "
        "decoder (3 of 28 layers, the third-last hidden states of the pipeline's chat template) and the ByT5 glyph "
        "encoder (2 of 12 layers, quoted text); flow-matching Euler (shift 5), classifier-free guidance",
        module=__name__,
        references={
            "transformer": ref.HUNYUAN_VIDEO15_480P_T2V_TRANSFORMER,
            "vae": ref.HUNYUAN_VIDEO15_VAE,
            "text_encoder": ref.QWEN25_VL_7B_TEXT_MODEL,
            "tokenizer": ref.QWEN25_VL_TOKENIZER,
            "text_encoder_2": ref.BYT5_SMALL_ENCODER,
            "tokenizer_2": ref.BYT5_TOKENIZER,
            "scheduler": ref.HUNYUAN_VIDEO15_480P_SCHEDULER,
        },
        depths=DEPTHS,
    ),
)


def tiny_text_encoder_config(variant: TinyVariant, tokenizer: Any) -> Config:
    """Qwen2.5-VL's decoder at the tiny Qwen-Image width and layout (`tiny/qwen.py`), with the tokenizer's vocabulary
    and start / end ids."""
    from onetrainer.tiny import components, qwen

    real = variant.references["text_encoder"]
    return components.tiny_config(
        "text_encoder",
        real,
        depth=variant.depths.get("text_encoder"),
        hidden_size=qwen.TEXT_WIDTH,
        intermediate_size=qwen.TEXT_MLP_WIDTH,
        num_attention_heads=qwen.TEXT_HEADS,
        num_key_value_heads=qwen.TEXT_KV_HEADS,
        rope_scaling={**real["rope_scaling"], "mrope_section": qwen.MROPE_SECTION},
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )


def build_glyph_encoder(variant: TinyVariant, seed: int) -> tuple[Any, Any]:
    """ByT5's tokenizer (bytes: it needs no file) and ByT5's encoder at the tiny width."""
    from transformers import ByT5Tokenizer

    from onetrainer.tiny import components

    settings = {k: v for k, v in variant.references["tokenizer_2"].items() if k != "tokenizer_class"}
    tokenizer = ByT5Tokenizer(**settings)
    config = components.tiny_config(
        "text_encoder",
        variant.references["text_encoder_2"],
        depth=variant.depths.get("text_encoder_2"),
        d_model=GLYPH_WIDTH,
        d_ff=GLYPH_WIDTH * 2,
        d_kv=GLYPH_WIDTH // components.TEXT_HEADS,
        num_heads=components.TEXT_HEADS,
        vocab_size=len(tokenizer),
    )
    return tokenizer, components.build(config, seed, "text_encoder_2")


def tiny_transformer_config(variant: TinyVariant, text_width: int) -> Config:
    from onetrainer.tiny import components

    return components.tiny_config(
        "transformer",
        variant.references["transformer"],
        depth=variant.depths.get("transformer"),
        num_attention_heads=TRANSFORMER_HEADS,
        attention_head_dim=HEAD_WIDTH,
        rope_axes_dim=ROPE_AXES,
        text_embed_dim=text_width,
        text_embed_2_dim=GLYPH_WIDTH,
        image_embed_dim=IMAGE_EMBED_WIDTH,
    )


def build_pipeline(variant: TinyVariant, seed: int) -> Any:
    """The pipeline: the transformer, Qwen2.5-VL's decoder and its tokenizer, the glyph encoder and its tokenizer,
    the VAE, the sampler and the guider at the model's scale."""
    from diffusers import ClassifierFreeGuidance

    from onetrainer.tiny import components
    from onetrainer.tiny.qwen_tokenizer import QWEN25_VL, build_qwen_tokenizer
    from onetrainer.util.threads import library_attribute

    refs = variant.references
    tokenizer = build_qwen_tokenizer(QWEN25_VL)
    text_encoder = components.build(tiny_text_encoder_config(variant, tokenizer), seed, "text_encoder")
    tokenizer_2, text_encoder_2 = build_glyph_encoder(variant, seed)
    vae = components.tiny_config("vae", refs["vae"], block_out_channels=VAE_CHANNELS)
    return library_attribute("diffusers", variant.pipeline_class)(
        transformer=components.build(
            tiny_transformer_config(variant, text_encoder.config.hidden_size), seed, "transformer"
        ),
        scheduler=components.build_scheduler(refs["scheduler"]),
        vae=components.build(vae, seed, "vae"),
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        text_encoder_2=text_encoder_2,
        tokenizer_2=tokenizer_2,
        guider=ClassifierFreeGuidance(guidance_scale=ref.HUNYUAN_VIDEO15_480P_GUIDANCE_SCALE),
    )


def store_extras(pipeline: Any, folder: Any, variant: TinyVariant) -> None:
    """The Qwen tokenizer in the hub's layout."""
    from onetrainer.tiny.qwen_tokenizer import rewrite_qwen_tokenizer

    rewrite_qwen_tokenizer(folder / "tokenizer", pipeline.tokenizer)


def transformer_inputs(model: Any, randn: Any) -> dict[str, Any]:
    """A 5-frame clip's latents (2 latent frames of 4x4, 64 px) with the conditioning latent and mask of text to video
    (zeros), 12 Qwen tokens (the second caption's last 5 masked), 6 glyph tokens (masked out for the first caption:
    no quoted text), the image embedding of text to video (zeros); the time is σ·1000."""
    import torch

    from onetrainer.tiny.denoiser_step import TIME_FRACTIONS

    config = model.config
    latents = randn(2, config.out_channels, 2, 4, 4)
    conditions = torch.zeros(2, config.in_channels - config.out_channels, 2, 4, 4)
    mask = torch.ones(2, 12, dtype=torch.int64)
    mask[1, 7:] = 0
    glyph_mask = torch.ones(2, 6, dtype=torch.int64)
    glyph_mask[0] = 0
    return {
        "hidden_states": torch.cat([latents, conditions], dim=1),
        "timestep": torch.tensor(TIME_FRACTIONS) * 1000,
        "encoder_hidden_states": randn(2, 12, config.text_embed_dim),
        "encoder_attention_mask": mask,
        "encoder_hidden_states_2": randn(2, 6, config.text_embed_2_dim),
        "encoder_attention_mask_2": glyph_mask,
        "image_embeds": torch.zeros(2, 1, config.image_embed_dim),
    }


DENOISER_INPUTS = {"HunyuanVideo15Transformer3DModel": transformer_inputs}
