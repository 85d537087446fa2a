"""Tiny Wan 2.1 pipeline (text to video): a 3-D DiT over (1, 2, 2) patches of 16-channel latents from Wan's causal
video VAE, cross-attending to UMT5's states; sampled with UniPC on flow sigmas."""

from __future__ import annotations

from typing import Any

from onetrainer.config.enums import ModelType
from onetrainer.tiny import reference as ref
from onetrainer.tiny.reference import Config
from onetrainer.tiny.variant import TinyVariant

LISTING_ORDER = 18  # the order the tiny models were added in

# The transformer: 2 heads of 12 (the real 12 of 128: the rotary split of a head, 2·(d/6) channels each for rows and
# columns, the rest for frames, stays whole), a feed-forward of 32, cross-attention over UMT5's tiny 32 channels.
TRANSFORMER_HEADS = 2
HEAD_WIDTH = 12
FFN_WIDTH = 32
# The VAE's first level width (the real 96; 8, not 16, makes its 3-D convolutions 5x faster on a CPU); the others are
# its multiples, as there.
VAE_BASE_WIDTH = 8

WIDTH_FIELDS = {"transformer": frozenset({"ffn_dim", "text_dim"}), "vae": frozenset({"base_dim"})}
DEPTH_FIELDS = {"transformer": frozenset({"num_layers"}), "text_encoder": frozenset({"num_layers"})}

BOUNDARY = ref.WAN22_BOUNDARY_RATIO  # Wan 2.2's model_index.json: the high-noise expert at t ≥ 0.875 · 1000
# Wan 2.1 1.3B's 30 blocks as 2; UMT5-XXL's 24 encoder layers as 2 (each has its own relative position bias).
WAN_DEPTH = {"transformer": {"num_layers": 2}, "text_encoder": {"num_layers": 2}}

VARIANTS = (
    TinyVariant(
        name="wan21",
        model_type=ModelType.WAN_2_1,
        pipeline_class="WanPipeline",
        description="Wan 2.1 T2V (Wan-AI/Wan2.1-T2V-1.3B-Diffusers): a 3-D DiT (2 of the real 30 blocks) over "
        "(1, 2, 2) patches of Wan's causal video VAE latents (8x spatial, 4x temporal; clips of 4k + 1 frames), "
        "cross-attending to UMT5-XXL (2 of 24 layers); UniPC on flow sigmas (shift 3), CFG with negative prompts",
        module=__name__,
        references={
            "transformer": ref.WAN21_T2V_1_3B_TRANSFORMER,
            "vae": ref.WAN_VAE,
            "text_encoder": ref.UMT5_XXL_ENCODER,
            "tokenizer": ref.UMT5_TOKENIZER,
            "scheduler": ref.WAN_SCHEDULER,
        },
        depths=WAN_DEPTH,
    ),
    TinyVariant(
        name="wan22",
        model_type=ModelType.WAN_2_2,
        pipeline_class="WanPipeline",
        description="Wan 2.2 T2V A14B (Wan-AI/Wan2.2-T2V-A14B-Diffusers): two experts of the 14B's shape (2 of the "
        "real 40 blocks each; `transformer` for the steps at σ ≥ the boundary 0.875, `transformer_2` below it) over "
        "Wan's causal video VAE latents, cross-attending to UMT5-XXL (2 of 24 layers); UniPC on flow sigmas",
        module=__name__,
        references={
            "transformer": ref.WAN22_T2V_A14B_TRANSFORMER,
            "transformer_2": ref.WAN22_T2V_A14B_TRANSFORMER,
            "vae": ref.WAN_VAE,
            "text_encoder": ref.UMT5_XXL_ENCODER,
            "tokenizer": ref.UMT5_TOKENIZER,
            "scheduler": ref.WAN_SCHEDULER,
        },
        depths={**WAN_DEPTH, "transformer_2": {"num_layers": 2}},
    ),
)


def tiny_transformer_config(variant: TinyVariant, part: str = "transformer") -> Config:
    from onetrainer.tiny import components

    return components.tiny_config(
        "transformer",
        variant.references[part],
        depth=variant.depths.get(part),
        num_attention_heads=TRANSFORMER_HEADS,
        attention_head_dim=HEAD_WIDTH,
        ffn_dim=FFN_WIDTH,
        text_dim=components.T5_WIDTH,
    )


def build_text_encoder(variant: TinyVariant, seed: int) -> tuple[Any, Any]:
    """The tiny T5 tokenizer (UMT5's is a T5 SentencePiece tokenizer with a larger vocabulary) and UMT5's encoder at
    the tiny T5 width, 2 layers."""
    from onetrainer.tiny import components
    from onetrainer.tiny.t5_tokenizer import build_t5_tokenizer

    tokenizer = build_t5_tokenizer()
    width = components.T5_WIDTH
    config = components.tiny_config(
        "text_encoder",
        variant.references["text_encoder"],
        depth=variant.depths.get("text_encoder"),
        d_model=width,
        d_ff=width * 2,
        d_kv=width // components.TEXT_HEADS,
        num_heads=components.TEXT_HEADS,
        vocab_size=len(tokenizer),
    )
    return tokenizer, components.build(config, seed, "text_encoder")


def build_pipeline(variant: TinyVariant, seed: int) -> Any:
    """The pipeline for `variant`: the transformer (Wan 2.2: both experts and the boundary), UMT5 and its tokenizer,
    the VAE, the UniPC sampler."""
    from onetrainer.tiny import components
    from onetrainer.util.threads import library_attribute

    refs = variant.references
    tokenizer, text_encoder = build_text_encoder(variant, seed)
    vae = components.tiny_config("vae", refs["vae"], base_dim=VAE_BASE_WIDTH)
    experts = {}
    if "transformer_2" in refs:  # Wan 2.2: the low-noise expert and the boundary
        config = tiny_transformer_config(variant, "transformer_2")
        experts = {"transformer_2": components.build(config, seed, "transformer_2"), "boundary_ratio": BOUNDARY}
    return library_attribute("diffusers", variant.pipeline_class)(
        **experts,
        transformer=components.build(tiny_transformer_config(variant), seed, "transformer"),
        scheduler=components.build_scheduler(refs["scheduler"]),
        vae=components.build(vae, seed, "vae"),
        text_encoder=text_encoder,
        tokenizer=tokenizer,
    )


def transformer_inputs(model: Any, randn: Any) -> dict[str, Any]:
    """A 5-frame clip's latents (2 latent frames of 8x8, 64 px) and 12 text tokens; the time is σ·1000."""
    import torch

    from onetrainer.tiny.denoiser_step import TIME_FRACTIONS

    config = model.config
    inputs = {
        "hidden_states": randn(2, config.in_channels, 2, 8, 8),
        "encoder_hidden_states": randn(2, 12, config.text_dim),
        "timestep": torch.tensor(TIME_FRACTIONS) * 1000,
    }
    if config.image_dim:  # Wan 2.1 I2V (tiny/wan_i2v.py): 257 CLIP image states
        inputs["encoder_hidden_states_image"] = randn(2, 257, config.image_dim)
    return inputs


DENOISER_INPUTS = {"WanTransformer3DModel": transformer_inputs}
