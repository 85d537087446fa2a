"""Tiny ERNIE-Image pipeline: a single-stream DiT with one shared AdaLN modulation over 2x2-patchified 32-channel
latents of Flux.2's VAE, conditioned on the second-to-last hidden states of Ministral 3 3B (Mistral3Model with a
one-block vision tower it never uses for text). The full-size references are the family's own declaration
(`families/ernie_info.py`)."""

from __future__ import annotations

from typing import Any

from onetrainer.config.enums import ModelType
from onetrainer.families import ernie_info as real
from onetrainer.tiny import mistral3_text
from onetrainer.tiny.mistral3_text import MISTRAL_WIDTH, tiny_mistral3_config
from onetrainer.tiny.mistral_tokenizer import MISTRAL_TOKENIZER
from onetrainer.tiny.variant import TinyVariant

LISTING_ORDER = 13  # the order the tiny models were added in

# 3 heads of 16 (48 wide; the real 32 of 128): the rotary embedding splits each head's width over its three axes as the
# real 32/48/48 split 128 (4/6/6, each even), and the model is wider than the text (32), so the text projection
# (`text_proj`, absent where they are equal) is there as in the real model. The MLP 3x the width, as 12288 is of 4096.
TRANSFORMER_HEADS = 3
HEAD_WIDTH = 16
ROPE_AXES = [4, 6, 6]
FFN_WIDTH = 3 * TRANSFORMER_HEADS * HEAD_WIDTH

WIDTH_FIELDS = {
    "transformer": frozenset({"hidden_size", "ffn_hidden_size", "text_in_dim", "rope_axes_dim"}),
    **mistral3_text.WIDTH_FIELDS,
}
DEPTH_FIELDS = {"transformer": frozenset({"num_layers"}), **mistral3_text.DEPTH_FIELDS}
NESTED_CONFIGS = mistral3_text.NESTED_CONFIGS

# The DiT's 36 blocks as 2; Ministral's 26 layers as 2 (the pipeline reads the second-to-last hidden states: the first
# layer's output, an inner layer's as in the real model), the vision tower 1 of its 24 blocks.
ERNIE_DEPTH = {
    "transformer": {"num_layers": 2},
    "text_encoder": {"text_config": {"num_hidden_layers": 2}, "vision_config": {"num_hidden_layers": 1}},
}

VARIANTS = (
    TinyVariant(
        name="ernie",
        model_type=ModelType.ERNIE,
        pipeline_class="ErnieImagePipeline",
        description="ERNIE-Image: single-stream shared-AdaLN DiT blocks (2 of the real 36) over 2x2-patchified latents "
        "of Flux.2's 32-channel VAE (normalised by its batch-norm statistics), 3D rotary positions, Ministral 3 3B "
        "text encoder (Mistral3Model: 2 of 26 language-model layers, the second-to-last hidden states; a 1-block "
        "Pixtral vision tower, unused for text), flow-matching Euler; no prompt enhancer",
        module=__name__,
        references={
            "transformer": real.ERNIE_IMAGE_TRANSFORMER,
            "vae": real.ref.FLUX2_VAE,
            "text_encoder": real.MINISTRAL3_3B,
            "tokenizer": MISTRAL_TOKENIZER,
            "scheduler": real.ERNIE_IMAGE_SCHEDULER,
        },
        depths=ERNIE_DEPTH,
    ),
)


def build_pipeline(variant: TinyVariant, seed: int) -> Any:
    """The pipeline for `variant`: the transformer (its modulation and output layer drawn, not zero), Ministral
    (Mistral3Model) and its tokenizer, the VAE (with batch-norm statistics of its own seed, as a trained VAE's are not 0
    and 1), the scheduler."""
    import torch

    from onetrainer.tiny import components
    from onetrainer.tiny.mistral_tokenizer import build_mistral_tokenizer
    from onetrainer.util.threads import library_attribute

    refs = variant.references
    tokenizer = build_mistral_tokenizer()
    text_encoder = components.build(tiny_mistral3_config(variant, tokenizer), seed, "text_encoder")
    transformer = components.tiny_config(
        "transformer",
        refs["transformer"],
        depth=variant.depths.get("transformer"),
        num_attention_heads=TRANSFORMER_HEADS,
        hidden_size=TRANSFORMER_HEADS * HEAD_WIDTH,
        ffn_hidden_size=FFN_WIDTH,
        rope_axes_dim=ROPE_AXES,
        text_in_dim=MISTRAL_WIDTH,
    )
    transformer = components.build(transformer, seed, "transformer")
    # diffusers starts the shared modulation and the output layer at zero (every block's gates closed, the output
    # zero), which a trained model's are not: a LoRA on the blocks would learn nothing through them
    with components.seeded(seed, "transformer.modulation"), torch.no_grad():
        transformer.adaLN_modulation[-1].reset_parameters()
        transformer.final_linear.reset_parameters()
    vae = components.build(components.tiny_vae_config(refs["vae"], variant.resolution), seed, "vae")
    with components.seeded(seed, "vae.bn"), torch.no_grad():
        vae.bn.running_mean.copy_(0.3 * torch.randn_like(vae.bn.running_mean))
        vae.bn.running_var.copy_(torch.empty_like(vae.bn.running_var).uniform_(0.5, 2.0))
    return library_attribute("diffusers", variant.pipeline_class)(
        transformer=transformer,
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        scheduler=components.build_scheduler(refs["scheduler"]),
    )


def transformer_inputs(model: Any, randn: Any) -> dict[str, Any]:
    """8x8 latents (128 px) patchified 2x2 into 4x4 tokens of 128 channels, 12 text tokens of which the second
    caption's last 5 are padding; the time is σ·1000."""
    import torch

    from onetrainer.tiny.denoiser_step import TIMESTEPS

    config = model.config
    return {
        "hidden_states": randn(2, config.in_channels, 4, 4),
        "timestep": torch.tensor(TIMESTEPS, dtype=torch.float32),
        "text_bth": randn(2, 12, config.text_in_dim),
        "text_lens": torch.tensor([12, 7]),
    }


DENOISER_INPUTS = {"ErnieImageTransformer2DModel": transformer_inputs}


def store_extras(pipeline: Any, folder: Any, variant: TinyVariant) -> None:
    """The tokenizer as a hub Mistral tokenizer folder holds it (tokenizer.json, tokenizer_config.json)."""
    import shutil

    from onetrainer.tiny.mistral_tokenizer import write_mistral_tokenizer_files

    shutil.rmtree(folder / "tokenizer")
    write_mistral_tokenizer_files(folder / "tokenizer")
