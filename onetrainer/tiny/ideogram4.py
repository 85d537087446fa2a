"""Tiny Ideogram 4 pipeline: a conditional and an unconditional single-stream DiT of one shape over a packed sequence
of text tokens and 2x2-patched 32-channel latents of Flux.2's VAE, conditioned on 13 of Qwen3-VL's decoder layers side
by side. The full-size references are the family's own declaration (`families/ideogram4_info.py`)."""

from __future__ import annotations

from typing import Any

from onetrainer.config.enums import ModelType
from onetrainer.families import ideogram4_info as real
from onetrainer.tiny import reference as tiny_ref
from onetrainer.tiny.variant import TinyVariant

LISTING_ORDER = 16  # the order the tiny models were added in

# The transformer: 2 heads of 16 (the real 18 of 256), the multimodal rotary sections 2/1/1 over each head's 8
# frequency pairs (as 24/20/20 cover 64 of 128), a SwiGLU 2x the width (the real 2.7x), the AdaLN conditioning half the
# width (the real 512 of 4608 is narrower still).
TRANSFORMER_HEADS = 2
HEAD_WIDTH = 16
MROPE_SECTION = [2, 1, 1]
MLP_WIDTH = 64
ADALN_WIDTH = 16
# Qwen3-VL's decoder at a tiny width, in the 8B's proportions: 4 query heads of 8 over 32 channels sharing one
# key/value head (32 share 8), a 2x MLP (the real 3x); all 36 layers, since the pipeline taps layers 0 to 35.
TEXT_WIDTH = 32
TEXT_HEADS = 4
TEXT_KV_HEADS = 1
TEXT_HEAD_WIDTH = 8
TEXT_MLP_WIDTH = 64
TEXT_MROPE_SECTION = [2, 1, 1]
TAPPED_LAYERS = 13  # the pipeline's QWEN3_VL_ACTIVATION_LAYERS
# The vision tower (never run for text): 2 heads of 8, a 2x MLP, its merged tokens at the decoder's width.
VISION_WIDTH = 16
VISION_HEADS = 2
VISION_MLP_WIDTH = 32

WIDTH_FIELDS = {
    "transformer": frozenset(
        {"attention_head_dim", "intermediate_size", "adaln_dim", "llm_features_dim", "mrope_section"}
    ),
    "text_encoder": frozenset(
        {"image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id", "text_config"}
    ),
    "text_config": frozenset(
        {
            "hidden_size",
            "intermediate_size",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "rope_parameters",
            "vocab_size",
            "bos_token_id",
            "eos_token_id",
        }
    ),
}
DEPTH_FIELDS = {
    "transformer": frozenset({"num_layers"}),
    "vision_config": frozenset({"deepstack_visual_indexes"}),
}
NESTED_CONFIGS = frozenset({"text_config"})

# The DiT's 34 blocks as 2 (both transformers); Qwen3-VL keeps its 36 decoder layers (the taps reach layer 35), its
# vision tower 3 of 27 blocks, each feeding the decoder (deepstack) as blocks 8, 16 and 24 do.
IDEOGRAM4_DEPTH = {
    "transformer": {"num_layers": 2},
    "unconditional_transformer": {"num_layers": 2},
    "text_encoder": {"vision_config": {"depth": 3, "deepstack_visual_indexes": [0, 1, 2]}},
}

VARIANTS = (
    TinyVariant(
        name="ideogram4",
        model_type=ModelType.IDEOGRAM_4,
        pipeline_class="Ideogram4Pipeline",
        description="Ideogram 4: single-stream DiT blocks (2 of the real 34) over one packed [text][image] sequence, "
        "a conditional and an unconditional transformer of that shape (asymmetric CFG), 2x2-patched latents of "
        "Flux.2's 32-channel VAE (normalised by its batch-norm statistics), Qwen3-VL-8B text encoder (all 36 decoder "
        "layers, 13 of them tapped side by side; vision tower 3 of 27 blocks, unused for text), flow-matching Euler on "
        "the pipeline's logit-normal schedule; no prompt enhancer",
        module=__name__,
        references={
            "transformer": real.IDEOGRAM4_TRANSFORMER,
            "unconditional_transformer": real.IDEOGRAM4_TRANSFORMER,
            "vae": real.ref.FLUX2_VAE,
            "text_encoder": real.QWEN3_VL_8B_TEXT,
            "tokenizer": tiny_ref.QWEN25_VL_TOKENIZER,  # Qwen3-VL's tokenizer_config.json settings are the same
            "scheduler": real.IDEOGRAM4_SCHEDULER,
        },
        depths=IDEOGRAM4_DEPTH,
    ),
)


def tiny_text_encoder_config(variant: TinyVariant, tokenizer: Any) -> dict:
    """Qwen3-VL at the tiny width, with the tokenizer's vocabulary and its ids of the start / end and vision tokens."""
    from onetrainer.tiny import components

    reference = variant.references["text_encoder"]
    ids = {
        name: tokenizer.convert_tokens_to_ids(token)
        for name, token in (
            ("image_token_id", "<|image_pad|>"),
            ("video_token_id", "<|video_pad|>"),
            ("vision_start_token_id", "<|vision_start|>"),
            ("vision_end_token_id", "<|vision_end|>"),
        )
    }
    text = reference["text_config"]
    return components.tiny_config(
        "text_encoder",
        reference,
        depth=variant.depths.get("text_encoder"),
        text_config={
            "hidden_size": TEXT_WIDTH,
            "intermediate_size": TEXT_MLP_WIDTH,
            "num_attention_heads": TEXT_HEADS,
            "num_key_value_heads": TEXT_KV_HEADS,
            "head_dim": TEXT_HEAD_WIDTH,
            "rope_parameters": {**text["rope_parameters"], "mrope_section": TEXT_MROPE_SECTION},
            "vocab_size": len(tokenizer),
            "bos_token_id": tokenizer.pad_token_id,  # "<|endoftext|>": the config calls it the start token
            "eos_token_id": tokenizer.eos_token_id,
        },
        vision_config={
            "hidden_size": VISION_WIDTH,
            "intermediate_size": VISION_MLP_WIDTH,
            "num_heads": VISION_HEADS,
            "out_hidden_size": TEXT_WIDTH,
        },
        **ids,
    )


def tiny_transformer_config(variant: TinyVariant) -> dict:
    from onetrainer.tiny import components

    return components.tiny_config(
        "transformer",
        variant.references["transformer"],
        depth=variant.depths.get("transformer"),
        num_attention_heads=TRANSFORMER_HEADS,
        attention_head_dim=HEAD_WIDTH,
        intermediate_size=MLP_WIDTH,
        adaln_dim=ADALN_WIDTH,
        llm_features_dim=TAPPED_LAYERS * TEXT_WIDTH,
        mrope_section=MROPE_SECTION,
    )


def build_pipeline(variant: TinyVariant, seed: int) -> Any:
    """The pipeline for `variant`: both transformers (each of its own seed), Qwen3-VL and its tokenizer, the VAE (with
    batch-norm statistics of its own seed, as a trained VAE's are not 0 and 1), the scheduler."""
    import torch

    from onetrainer.tiny import components
    from onetrainer.tiny.qwen_tokenizer import QWEN3_VL, build_qwen_tokenizer
    from onetrainer.util.threads import library_attribute

    refs = variant.references
    tokenizer = build_qwen_tokenizer(QWEN3_VL)
    transformer = tiny_transformer_config(variant)
    vae = components.build(components.tiny_vae_config(refs["vae"], variant.resolution), seed, "vae")
    with components.seeded(seed, "vae.bn"), torch.no_grad():
        vae.bn.running_mean.copy_(0.3 * torch.randn_like(vae.bn.running_mean))
        vae.bn.running_var.copy_(torch.empty_like(vae.bn.running_var).uniform_(0.5, 2.0))
    return library_attribute("diffusers", variant.pipeline_class)(
        scheduler=components.build_scheduler(refs["scheduler"]),
        vae=vae,
        text_encoder=components.build(tiny_text_encoder_config(variant, tokenizer), seed, "text_encoder"),
        tokenizer=tokenizer,
        transformer=components.build(transformer, seed, "transformer"),
        unconditional_transformer=components.build(transformer, seed, "unconditional_transformer"),
    )


def transformer_inputs(model: Any, randn: Any) -> dict[str, Any]:
    """8x8 latents (128 px) patched 2x2 into 16 tokens after a 6-token text block, the second caption's first 2 its
    padding (the pipeline's layout); the time 1 − σ."""
    import torch
    from diffusers import Ideogram4Pipeline

    from onetrainer.tiny.denoiser_step import TIME_FRACTIONS

    config = model.config
    text = 6
    positions, segments, indicator = Ideogram4Pipeline._prepare_ids([6, 4], 4, 4, text, "cpu")
    return {
        "hidden_states": randn(2, text + 16, config.in_channels),
        "timestep": 1.0 - torch.tensor(TIME_FRACTIONS),
        "encoder_hidden_states": randn(2, text + 16, config.llm_features_dim),
        "position_ids": positions,
        "segment_ids": segments,
        "indicator": indicator,
    }


DENOISER_INPUTS = {"Ideogram4Transformer2DModel": transformer_inputs}


def store_extras(pipeline: Any, folder, variant: TinyVariant) -> None:
    """The tokenizer in the hub's layout."""
    from onetrainer.tiny.qwen_tokenizer import rewrite_qwen_tokenizer

    rewrite_qwen_tokenizer(folder / "tokenizer", pipeline.tokenizer)
