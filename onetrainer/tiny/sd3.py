"""Tiny Stable Diffusion 3 and 3.5 pipelines: joint (MMDiT) transformer blocks over 2x2 patches of 16-channel latents,
conditioned on CLIP-L and CLIP-G (hidden states and projected pooled outputs) and T5."""

from __future__ import annotations

from typing import Any

from onetrainer.config.enums import ModelType
from onetrainer.tiny import reference as ref
from onetrainer.tiny.reference import Config
from onetrainer.tiny.variant import TinyVariant

LISTING_ORDER = 5

TRANSFORMER_HEADS = 2
HEAD_WIDTH = 16
# The CLIPs' hidden states (32 + 64 wide here) are zero-padded to T5's width and joined along the sequence: T5 must be
# at least as wide as both together, as the real 4096 is wider than 768 + 1280.
T5_WIDTH = 128
# Position table side in patches (192 in the real models, 384 for 3.5 Medium): up to 256 px here.
POSITION_SIDE = 16

# The text's projected width (the transformer's own), the text inputs' widths and the position table's side; SD 3.5
# Medium's dual-attention blocks are the first 13 of its 24: the tiny model's first of two.
WIDTH_FIELDS = {
    "transformer": frozenset(
        {"caption_projection_dim", "joint_attention_dim", "pooled_projection_dim", "pos_embed_max_size"}
    )
}
DEPTH_FIELDS = {"transformer": frozenset({"num_layers", "dual_attention_layers"})}

# SD3's 24 (3.5 Large: 38) joint blocks as 2: the second is the last, whose text branch ends early (context_pre_only);
# 3.5 Medium's dual-attention blocks (its first 13) as the first.
SD3_DEPTH = {"transformer": {"num_layers": 2}}
SD35_MEDIUM_DEPTH = {"transformer": {"num_layers": 2, "dual_attention_layers": [0]}}


def _sd3(transformer: Config) -> dict[str, Config]:
    return {
        "transformer": transformer,
        "vae": ref.SD3_VAE,
        "text_encoder": ref.CLIP_L_PROJECTED_TEXT,
        "tokenizer": ref.CLIP_TOKENIZER,
        "text_encoder_2": ref.CLIP_G_PROJECTED_TEXT,
        "tokenizer_2": ref.OPEN_CLIP_TOKENIZER,
        "text_encoder_3": ref.T5_XXL_ENCODER,
        "tokenizer_3": ref.T5_TOKENIZER,
        "scheduler": ref.FLOW_MATCH_EULER_SD3,
    }


VARIANTS = (
    TinyVariant(
        name="sd3",
        model_type=ModelType.STABLE_DIFFUSION_3,
        pipeline_class="StableDiffusion3Pipeline",
        description="Stable Diffusion 3 Medium: joint (MMDiT) blocks (2 of the real 24), CLIP-L and CLIP-G with "
        "projections + T5 v1.1 XXL (24 layers), 16-channel VAE, flow-matching Euler at shift 3",
        module=__name__,
        references=_sd3(ref.SD3_MEDIUM_TRANSFORMER),
        depths=SD3_DEPTH,
    ),
    TinyVariant(
        name="sd35-medium",
        model_type=ModelType.STABLE_DIFFUSION_35,
        pipeline_class="StableDiffusion3Pipeline",
        description="Stable Diffusion 3.5 Medium (MMDiT-X): sd3 with qk-norm and a second image self-attention in "
        "its first blocks",
        module=__name__,
        references=_sd3(ref.SD35_MEDIUM_TRANSFORMER),
        depths=SD35_MEDIUM_DEPTH,
    ),
    TinyVariant(
        name="sd35-large",
        model_type=ModelType.STABLE_DIFFUSION_35,
        pipeline_class="StableDiffusion3Pipeline",
        description="Stable Diffusion 3.5 Large: sd3's blocks (2 of the real 38) with qk-norm",
        module=__name__,
        references=_sd3(ref.SD35_LARGE_TRANSFORMER),
        depths=SD3_DEPTH,
    ),
)


def tiny_transformer_config(variant: TinyVariant, pooled_width: int) -> dict[str, Any]:
    from onetrainer.tiny import components

    real = variant.references["transformer"]
    return components.tiny_config(
        "transformer",
        real,
        depth=variant.depths.get("transformer"),
        num_attention_heads=TRANSFORMER_HEADS,
        attention_head_dim=HEAD_WIDTH,
        caption_projection_dim=TRANSFORMER_HEADS * HEAD_WIDTH,  # the transformer's width, as in the real models
        joint_attention_dim=T5_WIDTH,
        pooled_projection_dim=pooled_width,
        pos_embed_max_size=POSITION_SIDE,
    )


def build_pipeline(variant: TinyVariant, seed: int) -> Any:
    """The pipeline for `variant`: CLIP-L (text_encoder), CLIP-G (text_encoder_2), T5 (text_encoder_3), their
    tokenizers, the transformer, the VAE and the scheduler."""
    import torch

    from onetrainer.tiny import components
    from onetrainer.util.threads import library_attribute

    refs = variant.references
    tokenizer, text_encoder = components.build_clip_text(refs, seed)
    with torch.no_grad():  # SD 3's CLIP-L projects its pooled output with the identity (its files hold none)
        text_encoder.text_projection.weight.copy_(torch.eye(text_encoder.config.hidden_size))
    tokenizer_2, text_encoder_2 = components.build_clip_text(refs, seed, suffix="_2")
    tokenizer_3, text_encoder_3 = components.build_t5_text(refs, seed, suffix="_3", width=T5_WIDTH)
    pooled = text_encoder.config.projection_dim + text_encoder_2.config.projection_dim
    transformer = components.build(tiny_transformer_config(variant, pooled), seed, "transformer")
    return library_attribute("diffusers", variant.pipeline_class)(
        transformer=transformer,
        scheduler=components.build_scheduler(refs["scheduler"]),
        vae=components.build_vae(components.tiny_vae_config(refs["vae"], variant.resolution), seed),
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        text_encoder_2=text_encoder_2,
        tokenizer_2=tokenizer_2,
        text_encoder_3=text_encoder_3,
        tokenizer_3=tokenizer_3,
    )


def transformer_inputs(model: Any, randn: Any) -> dict[str, Any]:
    """8x8 latents (64 px), 16 text tokens, the CLIPs' pooled outputs."""
    import torch

    from onetrainer.tiny.denoiser_step import TIMESTEPS

    config = model.config
    return {
        "hidden_states": randn(2, config.in_channels, 8, 8),
        "encoder_hidden_states": randn(2, 16, config.joint_attention_dim),
        "pooled_projections": randn(2, config.pooled_projection_dim),
        "timestep": torch.tensor(TIMESTEPS),
    }


DENOISER_INPUTS = {"SD3Transformer2DModel": transformer_inputs}
