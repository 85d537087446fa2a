"""Tiny Z-Image pipeline: a single-stream DiT over 2x2 patches of 16-channel latents, conditioned on the penultimate
hidden states of a Qwen3 text encoder, which reads prompts through Qwen3's chat template."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from onetrainer.config.enums import ModelType
from onetrainer.tiny import reference as ref
from onetrainer.tiny.qwen3_text import store_as_causal_lm, tiny_qwen3_config
from onetrainer.tiny.variant import TinyVariant

LISTING_ORDER = 6

# 2 heads of 16: the rotary embedding splits each head's width over its three position axes (text position or frame,
# row, column), each an even number, as the real 32/48/48 split 128.
TRANSFORMER_HEADS = 2
HEAD_WIDTH = 16
ROPE_AXES = [4, 6, 6]

# The transformer's width, its heads (the rotary axes split each head's width) and the text encoder's width; Qwen3's
# grouped key/value heads and the heads' own width (wider than the model in Qwen3-4B).
WIDTH_FIELDS = {
    "transformer": frozenset({"dim", "n_heads", "n_kv_heads", "axes_dims", "cap_feat_dim"}),
    "text_encoder": frozenset({"num_key_value_heads", "head_dim"}),
}
# The main blocks are `n_layers` (its 2 + 2 refiner blocks stay); its Qwen3 text encoder repeats one decoder layer 36
# times.
DEPTH_FIELDS = {"transformer": frozenset({"n_layers"}), "text_encoder": frozenset({"num_hidden_layers"})}

# Z-Image's 30 main blocks as 2 (its 2 + 2 refiner blocks stay); Qwen3-4B's 36 decoder layers as 3: the pipeline
# reads the penultimate layer's output, so two layers feed the transformer and the last one's output goes unused, as in
# the real model.
Z_IMAGE_DEPTH = {"transformer": {"n_layers": 2}, "text_encoder": {"num_hidden_layers": 3}}

VARIANTS = (
    TinyVariant(
        name="z-image",
        model_type=ModelType.Z_IMAGE,
        pipeline_class="ZImagePipeline",
        description="Z-Image (Tongyi-MAI/Z-Image): single-stream DiT blocks (2 of the real 30, after 2 + 2 refiner "
        "blocks for the image and the text) with 3D rotary positions, Qwen3-4B text encoder (3 of 36 layers, its "
        "penultimate hidden states, prompts in Qwen3's chat template), 16-channel Flux VAE, flow-matching Euler at "
        "shift 6",
        module=__name__,
        references={
            "transformer": ref.Z_IMAGE_TRANSFORMER,
            "vae": ref.Z_IMAGE_VAE,
            "text_encoder": ref.QWEN3_4B_TEXT,
            "tokenizer": ref.QWEN3_TOKENIZER,
            "scheduler": ref.Z_IMAGE_SCHEDULER,
        },
        depths=Z_IMAGE_DEPTH,
    ),
)


def tiny_transformer_config(variant: TinyVariant, text_width: int) -> dict[str, Any]:
    """The transformer at the tiny width; `cap_feat_dim` is the text encoder's width, as 2560 is Qwen3-4B's."""
    from onetrainer.tiny import components

    return components.tiny_config(
        "transformer",
        variant.references["transformer"],
        depth=variant.depths.get("transformer"),
        dim=TRANSFORMER_HEADS * HEAD_WIDTH,
        n_heads=TRANSFORMER_HEADS,
        n_kv_heads=TRANSFORMER_HEADS,  # equal, as in the real model (its attention has no grouped heads)
        axes_dims=ROPE_AXES,
        cap_feat_dim=text_width,
    )


def build_pipeline(variant: TinyVariant, seed: int) -> Any:
    """The pipeline for `variant`: the transformer, the Qwen3 text_encoder and its tokenizer, the VAE, the
    scheduler."""
    from onetrainer.tiny import components
    from onetrainer.tiny.qwen_tokenizer import build_qwen_tokenizer
    from onetrainer.util.threads import library_attribute

    refs = variant.references
    tokenizer = build_qwen_tokenizer()
    text_encoder = components.build(tiny_qwen3_config(variant, tokenizer), seed, "text_encoder")
    config = tiny_transformer_config(variant, text_encoder.config.hidden_size)
    return library_attribute("diffusers", variant.pipeline_class)(
        transformer=components.build(config, seed, "transformer"),
        scheduler=components.build_scheduler(refs["scheduler"]),
        vae=components.build_vae(components.tiny_vae_config(refs["vae"], variant.resolution), seed),
        text_encoder=text_encoder,
        tokenizer=tokenizer,
    )


def transformer_inputs(model: Any, randn: Any) -> dict[str, Any]:
    """Lists, one entry per sample: 8x8 latents (64 px) as one frame, and captions of their own lengths. The model
    pads each part to a multiple of 32 tokens with its learned pad tokens (40 -> 64, 7 -> 32) and masks the shorter
    sequence. The time runs from 0 (noise) to 1 (image)."""
    import torch

    from onetrainer.tiny.denoiser_step import TIME_FRACTIONS

    config = model.config
    return {
        "x": [randn(config.in_channels, 1, 8, 8) for _ in range(2)],
        "t": torch.tensor(TIME_FRACTIONS),
        "cap_feats": [randn(40, config.cap_feat_dim), randn(7, config.cap_feat_dim)],
    }


DENOISER_INPUTS = {"ZImageTransformer2DModel": transformer_inputs}


def store_extras(pipeline: Any, folder: Path, variant: TinyVariant) -> None:
    """The text encoder and tokenizer as users' folders hold them (Z-Image's text encoder on the hub is a
    Qwen3ForCausalLM checkpoint: `qwen3_text.store_as_causal_lm`)."""
    from onetrainer.tiny.qwen_tokenizer import rewrite_qwen_tokenizer

    store_as_causal_lm(folder / "text_encoder")
    rewrite_qwen_tokenizer(folder / "tokenizer", pipeline.tokenizer)
