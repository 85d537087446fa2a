"""Tiny Krea 2 pipeline: a single-stream MMDiT over 2x2 patches of 16-channel latents from Qwen-Image's video VAE (on
single frames), conditioned on a stack of Qwen3-VL's hidden states (the pipeline's `text_encoder_select_layers`),
which its text-fusion blocks collapse before they join the image tokens."""

from __future__ import annotations

from typing import Any

from onetrainer.config.enums import ModelType
from onetrainer.tiny import qwen3_vl_text
from onetrainer.tiny import reference as ref
from onetrainer.tiny.qwen3_vl_text import TEXT_WIDTH, tiny_qwen3_vl_config
from onetrainer.tiny.reference import Config
from onetrainer.tiny.variant import TinyVariant

LISTING_ORDER = 13  # the order the tiny models were added in

# The transformer: 4 query heads of 8 sharing 1 key/value head (as 48 share 12), the rotary split 4/2/2 over
# (t, row, column) as 32/48/48 split 128, a 2x SwiGLU (the real 2.7x), an 16-wide sinusoidal time embedding.
TRANSFORMER_HEADS = 4
TRANSFORMER_KV_HEADS = 1
HEAD_WIDTH = 8
ROPE_AXES = [4, 2, 2]
MLP_WIDTH = 64
TIME_WIDTH = 16
# The text fusion: 2 heads of 16 over the text encoder's 32 channels, as 20 of 128 over 2560 (as many key/value heads).
FUSION_HEADS = 2
FUSION_MLP_WIDTH = 64
# Qwen3-VL-4B at the tiny width of `qwen3_vl_text` (its decoder 32 wide, its vision tower 16).
# The VAE's first level width (the real 96); the others are its multiples, as there.
VAE_BASE_WIDTH = 16
# Qwen3-VL-4B's 36 decoder layers as 3, its hidden states tapped at 1 and 2 (the real 12 taps, every third layer from
# the 2nd to the 35th, also leave the last layer's output out); its vision tower's 24 blocks as 3, each feeding the
# decoder (deepstack), as blocks 5, 11 and 17 do.
TAPS = (1, 2)

WIDTH_FIELDS = {
    "transformer": frozenset(
        {
            "num_key_value_heads",
            "intermediate_size",
            "timestep_embed_dim",
            "text_hidden_dim",
            "num_text_layers",
            "text_num_attention_heads",
            "text_num_key_value_heads",
            "text_intermediate_size",
            "axes_dims_rope",
        }
    ),
    **qwen3_vl_text.WIDTH_FIELDS,
}
DEPTH_FIELDS = {
    "transformer": frozenset({"num_layers"}),
    "text_config": frozenset({"num_hidden_layers"}),
    "vision_config": frozenset({"deepstack_visual_indexes"}),
}
NESTED_CONFIGS = qwen3_vl_text.NESTED_CONFIGS

KREA2_DEPTH = {
    "transformer": {"num_layers": 2},
    "text_encoder": {
        "text_config": {"num_hidden_layers": 3},
        "vision_config": {"depth": 3, "deepstack_visual_indexes": [0, 1, 2]},
    },
}

VARIANTS = (
    TinyVariant(
        name="krea2",
        model_type=ModelType.KREA_2,
        pipeline_class="Krea2Pipeline",
        description="Krea 2 (krea/Krea-2-Raw): single-stream MMDiT blocks (2 of the real 28) with grouped-query "
        "attention and a text-fusion stage over a stack of Qwen3-VL-4B's hidden states (3 of 36 decoder layers, 2 "
        "taps for the real 12, Qwen-Image's prompt template padded in the middle; vision tower 3 of 24 blocks), "
        "Qwen-Image's 16-channel video VAE on single frames, flow-matching Euler with an exponential "
        "resolution-dependent shift; CFG with negative prompts",
        module=__name__,
        references={
            "transformer": ref.KREA2_TRANSFORMER,
            "vae": ref.QWEN_IMAGE_VAE,
            "text_encoder": ref.QWEN3_VL_4B_TEXT,
            "tokenizer": ref.QWEN25_VL_TOKENIZER,
            "scheduler": ref.KREA2_SCHEDULER,
        },
        depths=KREA2_DEPTH,
    ),
)


def tiny_transformer_config(variant: TinyVariant) -> Config:
    from onetrainer.tiny import components

    return components.tiny_config(
        "transformer",
        variant.references["transformer"],
        depth=variant.depths.get("transformer"),
        num_attention_heads=TRANSFORMER_HEADS,
        num_key_value_heads=TRANSFORMER_KV_HEADS,
        attention_head_dim=HEAD_WIDTH,
        axes_dims_rope=ROPE_AXES,
        intermediate_size=MLP_WIDTH,
        timestep_embed_dim=TIME_WIDTH,
        text_hidden_dim=TEXT_WIDTH,
        num_text_layers=len(TAPS),
        text_num_attention_heads=FUSION_HEADS,
        text_num_key_value_heads=FUSION_HEADS,
        text_intermediate_size=FUSION_MLP_WIDTH,
    )


def build_pipeline(variant: TinyVariant, seed: int) -> Any:
    """The pipeline for `variant`: the transformer, Qwen3-VL and its tokenizer, the VAE, the scheduler, and the taps
    of the tiny text encoder's hidden states."""
    from onetrainer.tiny import components
    from onetrainer.tiny.qwen_tokenizer import QWEN25_VL, build_qwen_tokenizer
    from onetrainer.util.threads import library_attribute

    refs = variant.references
    tokenizer = build_qwen_tokenizer(QWEN25_VL)
    vae = components.tiny_config("vae", refs["vae"], base_dim=VAE_BASE_WIDTH)
    return library_attribute("diffusers", variant.pipeline_class)(
        transformer=components.build(tiny_transformer_config(variant), seed, "transformer"),
        scheduler=components.build_scheduler(refs["scheduler"]),
        vae=components.build(vae, seed, "vae"),
        text_encoder=components.build(tiny_qwen3_vl_config(variant, tokenizer), seed, "text_encoder"),
        tokenizer=tokenizer,
        text_encoder_select_layers=TAPS,
    )


def transformer_inputs(model: Any, randn: Any) -> dict[str, Any]:
    """8x8 latents (64 px) packed 2x2 into 16 tokens at their grid positions after 12 text tokens at the origin, the
    second caption's middle 5 padding (masked). The time is the flow's sigma."""
    import torch
    from diffusers import Krea2Pipeline

    from onetrainer.tiny.denoiser_step import TIME_FRACTIONS

    config = model.config
    tokens = 12
    mask = torch.ones(2, tokens, dtype=torch.bool)
    mask[1, 4:9] = False
    return {
        "hidden_states": randn(2, 16, config.in_channels),
        "encoder_hidden_states": randn(2, tokens, config.num_text_layers, config.text_hidden_dim),
        "encoder_attention_mask": mask,
        "timestep": torch.tensor(TIME_FRACTIONS),
        "position_ids": Krea2Pipeline.prepare_position_ids(tokens, 4, 4, "cpu"),
    }


DENOISER_INPUTS = {"Krea2Transformer2DModel": transformer_inputs}


def store_extras(pipeline: Any, folder, variant: TinyVariant) -> None:
    """The tokenizer in the hub's layout."""
    from onetrainer.tiny.qwen_tokenizer import rewrite_qwen_tokenizer

    rewrite_qwen_tokenizer(folder / "tokenizer", pipeline.tokenizer)
