"""Tiny Sana pipeline: a linear-attention DiT over 1x1 patches of a deep-compression autoencoder's 32-channel latents
(32x down), conditioned on Gemma-2's last hidden states, which reads prompts after Sana's complex human instruction."""

from __future__ import annotations

from typing import Any

from onetrainer.config.enums import ModelType
from onetrainer.tiny import reference as ref
from onetrainer.tiny.gemma2_text import GEMMA2_WIDTH_FIELDS, TEXT_WIDTH, tiny_gemma2_config
from onetrainer.tiny.variant import TinyVariant

LISTING_ORDER = 12  # the order the tiny models were added in

# The transformer: 2 self-attention heads of 8 (16 wide), its cross-attention 2 heads of 8 onto the same width, as
# Sana 1600M's 20 x 112 is its 70 x 32 = 2240.
TRANSFORMER_HEADS = 2
HEAD_WIDTH = 8
# The autoencoder's six stages at 1/16 of the real widths (128 … 1024); its attention heads 8 wide (real: 32).
VAE_CHANNELS = [8, 16, 32, 32, 64, 64]
VAE_HEAD_WIDTH = 8

WIDTH_FIELDS = {
    "transformer": frozenset(
        {"num_cross_attention_heads", "cross_attention_head_dim", "cross_attention_dim", "caption_channels"}
    ),
    "text_encoder": GEMMA2_WIDTH_FIELDS,
    "vae": frozenset({"encoder_block_out_channels", "decoder_block_out_channels", "attention_head_dim"}),
}
# Sana 1600M's 20 blocks as 2; Gemma-2 2B's 26 layers as 2 (one sliding-window layer, one full, as they alternate).
DEPTH_FIELDS = {"transformer": frozenset({"num_layers"}), "text_encoder": frozenset({"num_hidden_layers"})}
SANA_DEPTH = {"transformer": {"num_layers": 2}, "text_encoder": {"num_hidden_layers": 2}}

VARIANTS = (
    TinyVariant(
        name="sana",
        model_type=ModelType.SANA,
        pipeline_class="SanaPipeline",
        description="Sana 1600M 1024px: linear-attention DiT blocks (2 of the real 20) with a GLUMBConv feed-forward "
        "and cross-attention to Gemma-2 2B (2 of 26 layers, its last hidden states, prompts after Sana's complex "
        "human instruction), DC-AE f32c32 autoencoder (32x down, 32 channels), DPM-Solver++ on flow sigmas at shift 3",
        module=__name__,
        references={
            "transformer": ref.SANA_1600M_TRANSFORMER,
            "vae": ref.SANA_DC_AE,
            "text_encoder": ref.GEMMA2_2B_TEXT,
            "tokenizer": ref.GEMMA_TOKENIZER,
            "scheduler": ref.SANA_SCHEDULER,
        },
        depths=SANA_DEPTH,
    ),
)


def build_pipeline(variant: TinyVariant, seed: int) -> Any:
    """The pipeline for `variant`: the transformer, Gemma-2 and its tokenizer, the autoencoder, the scheduler."""
    from onetrainer.families.sana import COMPLEX_HUMAN_INSTRUCTION
    from onetrainer.tiny import components
    from onetrainer.tiny.gemma_tokenizer import build_gemma_tokenizer
    from onetrainer.util.threads import library_attribute

    refs = variant.references
    tokenizer = build_gemma_tokenizer("\n".join(COMPLEX_HUMAN_INSTRUCTION))
    text_encoder = components.build(tiny_gemma2_config(variant, tokenizer), seed, "text_encoder")
    transformer = components.tiny_config(
        "transformer",
        refs["transformer"],
        depth=variant.depths.get("transformer"),
        num_attention_heads=TRANSFORMER_HEADS,
        attention_head_dim=HEAD_WIDTH,
        num_cross_attention_heads=TRANSFORMER_HEADS,
        cross_attention_head_dim=HEAD_WIDTH,
        cross_attention_dim=TRANSFORMER_HEADS * HEAD_WIDTH,
        caption_channels=TEXT_WIDTH,
    )
    vae = components.tiny_config(
        "vae",
        refs["vae"],
        encoder_block_out_channels=VAE_CHANNELS,
        decoder_block_out_channels=VAE_CHANNELS,
        attention_head_dim=VAE_HEAD_WIDTH,
    )
    return library_attribute("diffusers", variant.pipeline_class)(
        tokenizer=tokenizer,
        text_encoder=text_encoder,
        vae=components.build(vae, seed, "vae"),
        transformer=components.build(transformer, seed, "transformer"),
        scheduler=components.build_scheduler(refs["scheduler"]),
    )


def transformer_inputs(model: Any, randn: Any) -> dict[str, Any]:
    """2x2 latents (64 px), 300 caption tokens of which the second caption's last 200 are padding."""
    import torch

    from onetrainer.tiny.denoiser_step import TIMESTEPS

    config = model.config
    mask = torch.ones(2, 300, dtype=torch.long)
    mask[1, 100:] = 0
    return {
        "hidden_states": randn(2, config.in_channels, 2, 2),
        "timestep": torch.tensor(TIMESTEPS, dtype=torch.float32),
        "encoder_hidden_states": randn(2, 300, config.caption_channels),
        "encoder_attention_mask": mask,
    }


DENOISER_INPUTS = {"SanaTransformer2DModel": transformer_inputs}
