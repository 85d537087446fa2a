"""Tiny Ideogram 4 pipeline: a conditional and an unconditional single-stream DiT of one shape over a packed sequence
of text tokens and 2x2-patched 32-channel latents of Flux.2's VAE, conditioned on 13 of Qwen3-VL's decoder layers side
by side. The full-size references are the family's own declaration (`families/ideogram4_info.py`)."""

from __future__ import annotations

from typing import Any

from onetrainer.config.enums import ModelType
from onetrainer.families import ideogram4_info as real
from onetrainer.tiny import qwen3_vl_text
from onetrainer.tiny import reference as tiny_ref
from onetrainer.tiny.qwen3_vl_text import TEXT_WIDTH, tiny_qwen3_vl_config
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
# Qwen3-VL-8B at the tiny width of `qwen3_vl_text` (its decoder 32 wide, its vision tower 16); all 36 decoder
# layers, since the pipeline taps layers 0 to 35.
TAPPED_LAYERS = 13  # the pipeline's QWEN3_VL_ACTIVATION_LAYERS

WIDTH_FIELDS = {
    "transformer": frozenset(
        {"attention_head_dim", "intermediate_size", "adaln_dim", "llm_features_dim", "mrope_section"}
    ),
    **qwen3_vl_text.WIDTH_FIELDS,
}
DEPTH_FIELDS = {
    "transformer": frozenset({"num_layers"}),
    "vision_config": frozenset({"deepstack_visual_indexes"}),
}
NESTED_CONFIGS = qwen3_vl_text.NESTED_CONFIGS

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
        text_encoder=components.build(tiny_qwen3_vl_config(variant, tokenizer), seed, "text_encoder"),
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
