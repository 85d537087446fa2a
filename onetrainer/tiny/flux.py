"""Tiny Flux.1 (dev, schnell, Fill) and Chroma pipelines: double- and single-stream transformer blocks over packed
16-channel latents, conditioned on T5 (and, for Flux, CLIP-L's pooled output)."""

from __future__ import annotations

from typing import Any

from onetrainer.config.enums import ModelType
from onetrainer.tiny import reference as ref
from onetrainer.tiny.reference import Config
from onetrainer.tiny.variant import TinyVariant

LISTING_ORDER = 4

# 2 heads of 16: the rotary embedding splits each head's width over its three position axes (unused, row, column),
# each an even number, as the real 16/56/56 split 128.
TRANSFORMER_HEADS = 2
HEAD_WIDTH = 16
ROPE_AXES = [4, 6, 6]
APPROXIMATOR_WIDTH = 32  # Chroma's modulation network (5120 wide in the real model)

# The text inputs' widths, the rotary axes (they split the head width), the approximator.
WIDTH_FIELDS = {
    "transformer": frozenset(
        {"joint_attention_dim", "pooled_projection_dim", "axes_dims_rope", "approximator_hidden_dim"}
    )
}
DEPTH_FIELDS = {"transformer": frozenset({"num_layers", "num_single_layers"})}

# Flux's and Chroma's 19 double-stream and 38 single-stream blocks as 2 of each: every key pattern, a fraction of the
# time.
FLUX_DEPTH = {"transformer": {"num_layers": 2, "num_single_layers": 2}}


def _flux(transformer: Config, scheduler: Config) -> dict[str, Config]:
    return {
        "transformer": transformer,
        "vae": ref.FLUX_VAE,
        "text_encoder": ref.CLIP_L_TEXT,
        "tokenizer": ref.CLIP_TOKENIZER,
        "text_encoder_2": ref.T5_XXL_ENCODER,
        "tokenizer_2": ref.T5_TOKENIZER,
        "scheduler": scheduler,
    }


VARIANTS = (
    TinyVariant(
        name="flux-dev",
        model_type=ModelType.FLUX_DEV_1,
        pipeline_class="FluxPipeline",
        description="FLUX.1-dev: double- and single-stream transformer blocks (2 + 2 of the real 19 + 38) with a "
        "guidance embedding, CLIP-L (12 layers, pooled) + T5 v1.1 XXL (24 layers), 16-channel VAE, flow-matching "
        "Euler with a resolution-dependent shift",
        module=__name__,
        references=_flux(ref.FLUX_DEV_TRANSFORMER, ref.FLOW_MATCH_EULER_DYNAMIC),
        depths=FLUX_DEPTH,
    ),
    TinyVariant(
        name="flux-schnell",
        model_type=ModelType.FLUX_DEV_1,
        pipeline_class="FluxPipeline",
        description="FLUX.1-schnell: flux-dev without the guidance embedding, flow-matching Euler without shift "
        "(samples in ~4 steps, T5 prompts of 256 tokens)",
        module=__name__,
        references=_flux(ref.FLUX_SCHNELL_TRANSFORMER, ref.FLOW_MATCH_EULER_SCHNELL),
        depths=FLUX_DEPTH,
    ),
    TinyVariant(
        name="flux-fill",
        model_type=ModelType.FLUX_FILL_DEV_1,
        pipeline_class="FluxFillPipeline",
        description="FLUX.1-Fill-dev: flux-dev taking the masked image's latents and the packed 8x8-pixel mask "
        "beside the noisy latents (384 input channels at full size)",
        module=__name__,
        references=_flux(ref.FLUX_FILL_TRANSFORMER, ref.FLOW_MATCH_EULER_DYNAMIC),
        depths=FLUX_DEPTH,
    ),
    TinyVariant(
        name="chroma",
        model_type=ModelType.CHROMA_1,
        pipeline_class="ChromaPipeline",
        description="Chroma1-HD: Flux's blocks (2 + 2 of 19 + 38) modulated by an approximator network, T5 v1.1 XXL "
        "alone with its attention mask, 16-channel VAE, flow-matching Euler; real CFG with negative prompts",
        module=__name__,
        references={
            "transformer": ref.CHROMA_TRANSFORMER,
            "vae": ref.FLUX_VAE,
            "text_encoder": ref.T5_XXL_ENCODER,
            "tokenizer": ref.T5_TOKENIZER,
            "scheduler": ref.FLOW_MATCH_EULER_DYNAMIC,
        },
        depths=FLUX_DEPTH,
    ),
)


def tiny_transformer_config(variant: TinyVariant, pooled_width: int | None) -> dict[str, Any]:
    from onetrainer.tiny import components

    real = variant.references["transformer"]
    widths: dict[str, Any] = {
        "num_attention_heads": TRANSFORMER_HEADS,
        "attention_head_dim": HEAD_WIDTH,
        "axes_dims_rope": ROPE_AXES,
        "joint_attention_dim": components.T5_WIDTH,
    }
    if "pooled_projection_dim" in real:  # Flux: CLIP-L's pooled output
        widths["pooled_projection_dim"] = pooled_width
    if "approximator_hidden_dim" in real:  # Chroma
        widths["approximator_hidden_dim"] = APPROXIMATOR_WIDTH
    return components.tiny_config("transformer", real, depth=variant.depths.get("transformer"), **widths)


def build_pipeline(variant: TinyVariant, seed: int) -> Any:
    """The pipeline for `variant`: Flux's references name the transformer, vae, CLIP text_encoder and tokenizer, T5
    text_encoder_2 and tokenizer_2, and the scheduler; Chroma's name one T5 text_encoder and tokenizer."""
    from onetrainer.tiny import components
    from onetrainer.util.threads import library_attribute

    refs = variant.references
    vae = components.build_vae(components.tiny_vae_config(refs["vae"], variant.resolution), seed)
    scheduler = components.build_scheduler(refs["scheduler"])
    pipeline_class = library_attribute("diffusers", variant.pipeline_class)
    if "text_encoder_2" not in refs:  # Chroma: T5 alone
        tokenizer, text_encoder = components.build_t5_text(refs, seed)
        transformer = components.build(tiny_transformer_config(variant, None), seed, "transformer")
        return pipeline_class(
            scheduler=scheduler, vae=vae, text_encoder=text_encoder, tokenizer=tokenizer, transformer=transformer
        )
    tokenizer, text_encoder = components.build_clip_text(refs, seed)
    tokenizer_2, text_encoder_2 = components.build_t5_text(refs, seed, suffix="_2")
    config = tiny_transformer_config(variant, text_encoder.config.hidden_size)
    return pipeline_class(
        scheduler=scheduler,
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        text_encoder_2=text_encoder_2,
        tokenizer_2=tokenizer_2,
        transformer=components.build(config, seed, "transformer"),
    )


def transformer_inputs(model: Any, randn: Any) -> dict[str, Any]:
    """8x8 latents (64 px) packed 2x2 into 16 tokens, 16 T5 tokens; the time is the flow's sigma. Chroma's second
    caption ends in 6 tokens of padding, masked; Flux takes CLIP's pooled output and (dev) the guidance."""
    import torch

    from onetrainer.tiny.denoiser_step import TIME_FRACTIONS

    config = model.config
    rows, columns, tokens = 4, 4, 16
    image_ids = torch.zeros(rows, columns, 3)
    image_ids[..., 1] += torch.arange(rows)[:, None]
    image_ids[..., 2] += torch.arange(columns)[None, :]
    inputs = {
        "hidden_states": randn(2, rows * columns, config.in_channels),
        "encoder_hidden_states": randn(2, tokens, config.joint_attention_dim),
        "timestep": torch.tensor(TIME_FRACTIONS),
        "img_ids": image_ids.reshape(-1, 3),
        "txt_ids": torch.zeros(tokens, 3),
    }
    if type(model).__name__ == "ChromaTransformer2DModel":
        mask = torch.ones(2, tokens + rows * columns, dtype=torch.bool)
        mask[1, tokens - 6 : tokens] = False
        inputs["attention_mask"] = mask
        return inputs
    inputs["pooled_projections"] = randn(2, config.pooled_projection_dim)
    if config.guidance_embeds:
        inputs["guidance"] = torch.tensor([3.5, 1.0])
    return inputs


DENOISER_INPUTS = {"FluxTransformer2DModel": transformer_inputs, "ChromaTransformer2DModel": transformer_inputs}
