"""Tiny HunyuanVideo pipeline (text to video): double- and single-stream blocks over (1, 2, 2) patches of 16-channel
latents from HunyuanVideo's causal video VAE, a token refiner over a Llama's third-last hidden states, CLIP-L's pooled
output and the distilled guidance value in the time embedding; flow-matching Euler at shift 7."""

from __future__ import annotations

from typing import Any

from onetrainer.config.enums import ModelType
from onetrainer.tiny import reference as ref
from onetrainer.tiny.reference import Config
from onetrainer.tiny.variant import TinyVariant

LISTING_ORDER = 20  # the order the tiny models were added in

# The transformer: 2 heads of 16 (the real 24 of 128), the rotary split 4/6/6 over (frames, rows, columns) as the real
# 16/56/56 splits 128.
TRANSFORMER_HEADS = 2
HEAD_WIDTH = 16
ROPE_AXES = [4, 6, 6]
# The Llama at a tiny width of its own (the real 4096), distinct from CLIP-L's tiny 32 so that a mix-up shows: 4 query
# heads sharing 1 key/value head (the real 32 and 8), 12 wide.
LLAMA_WIDTH = 48
LLAMA_HEADS = 4
LLAMA_KV_HEADS = 1
LLAMA_HEAD_WIDTH = 12
LLAMA_MLP_WIDTH = 96
LLAMA_PAD_TOKEN = "<|end_of_text|>"  # the tiny tokenizer's padding token (captions are padded on the right)
# The VAE's level widths (the real 128, 256, 512, 512) as 8, 16, 32, 32: its 3-D convolutions dominate a CPU step.
VAE_WIDTHS = [8, 16, 32, 32]

WIDTH_FIELDS = {
    "transformer": frozenset({"text_embed_dim", "pooled_projection_dim", "rope_axes_dim"}),
    "text_encoder": frozenset({"num_key_value_heads", "head_dim"}),
}
DEPTH_FIELDS = {
    "transformer": frozenset({"num_layers", "num_single_layers"}),
    "text_encoder": frozenset({"num_hidden_layers"}),
}

# The real 20 double- and 40 single-stream blocks as one of each (the token refiner keeps its real 2); Llama's 32
# layers as 3, so that the third-last hidden state the pipeline reads is a layer's output (not the embeddings); CLIP-L's
# 12 layers as 2.
HUNYUAN_VIDEO_DEPTH = {
    "transformer": {"num_layers": 1, "num_single_layers": 1},
    "text_encoder": {"num_hidden_layers": 3},
    "text_encoder_2": {"num_hidden_layers": 2},
}

VARIANTS = (
    TinyVariant(
        name="hunyuan-video",
        model_type=ModelType.HUNYUAN_VIDEO,
        pipeline_class="HunyuanVideoPipeline",
        description="HunyuanVideo (hunyuanvideo-community/HunyuanVideo): double- and single-stream blocks (1 of the "
        "real 20 and 1 of 40) over (1, 2, 2) patches of HunyuanVideo's causal video VAE latents (8x spatial, 4x "
        "temporal; clips of 4k + 1 frames), a token refiner over LLaVA-Llama-3's third-last hidden states (3 of 32 "
        "layers, prompted with the pipeline's template), CLIP-L pooled (2 of 12 layers) and the distilled guidance; "
        "flow-matching Euler at shift 7",
        module=__name__,
        references={
            "transformer": ref.HUNYUAN_VIDEO_TRANSFORMER,
            "vae": ref.HUNYUAN_VIDEO_VAE,
            "text_encoder": ref.HUNYUAN_VIDEO_LLAMA_TEXT,
            "tokenizer": ref.HUNYUAN_VIDEO_LLAMA_TOKENIZER,
            "text_encoder_2": ref.CLIP_L_TEXT,
            "tokenizer_2": ref.CLIP_TOKENIZER,
            "scheduler": ref.HUNYUAN_VIDEO_SCHEDULER,
        },
        depths=HUNYUAN_VIDEO_DEPTH,
    ),
)


def tiny_llama_config(variant: TinyVariant, tokenizer: Any) -> Config:
    """The Llama at the tiny width, with the tokenizer's vocabulary and its ids of the start and end tokens."""
    from onetrainer.tiny import components

    return components.tiny_config(
        "text_encoder",
        variant.references["text_encoder"],
        depth=variant.depths.get("text_encoder"),
        hidden_size=LLAMA_WIDTH,
        intermediate_size=LLAMA_MLP_WIDTH,
        num_attention_heads=LLAMA_HEADS,
        num_key_value_heads=LLAMA_KV_HEADS,
        head_dim=LLAMA_HEAD_WIDTH,
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|end_of_text|>"),
        pad_token_id=tokenizer.pad_token_id,
    )


def tiny_transformer_config(variant: TinyVariant, pooled_width: int) -> Config:
    from onetrainer.tiny import components

    return components.tiny_config(
        "transformer",
        variant.references["transformer"],
        depth=variant.depths.get("transformer"),
        num_attention_heads=TRANSFORMER_HEADS,
        attention_head_dim=HEAD_WIDTH,
        rope_axes_dim=ROPE_AXES,
        text_embed_dim=LLAMA_WIDTH,
        pooled_projection_dim=pooled_width,
    )


def build_llama_text(variant: TinyVariant, seed: int) -> tuple[Any, Any]:
    """The tiny Llama 3 tokenizer (padding with the end-of-text token, on the right) and the Llama at the tiny width."""
    from onetrainer.tiny import components
    from onetrainer.tiny.llama_tokenizer import build_llama_tokenizer

    tokenizer = build_llama_tokenizer()
    tokenizer.pad_token = LLAMA_PAD_TOKEN
    tokenizer.padding_side = "right"
    return tokenizer, components.build(tiny_llama_config(variant, tokenizer), seed, "text_encoder")


def build_pipeline(variant: TinyVariant, seed: int) -> Any:
    """The pipeline for `variant`: the transformer, the Llama and CLIP-L with their tokenizers, the VAE, the sampler."""
    from onetrainer.tiny import components
    from onetrainer.tiny.reference import with_depth
    from onetrainer.tiny.tokenizer import build_clip_tokenizer
    from onetrainer.util.threads import library_attribute

    refs = variant.references
    tokenizer, text_encoder = build_llama_text(variant, seed)
    tokenizer_2 = build_clip_tokenizer(pad_token=refs["tokenizer_2"]["pad_token"])
    clip = with_depth(refs["text_encoder_2"], variant.depths.get("text_encoder_2"))
    text_encoder_2 = components.build(components.tiny_clip_text_config(clip, tokenizer_2), seed, "text_encoder_2")
    vae = components.tiny_config(
        "vae",
        refs["vae"],
        block_out_channels=VAE_WIDTHS,
        norm_num_groups=components.NORM_GROUPS,
    )
    pooled = text_encoder_2.config.hidden_size
    return library_attribute("diffusers", variant.pipeline_class)(
        transformer=components.build(tiny_transformer_config(variant, pooled), seed, "transformer"),
        scheduler=components.build_scheduler(refs["scheduler"]),
        vae=components.build(vae, seed, "vae"),
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        text_encoder_2=text_encoder_2,
        tokenizer_2=tokenizer_2,
    )


def transformer_inputs(model: Any, randn: Any) -> dict[str, Any]:
    """A 5-frame clip's latents (2 latent frames of 8x8, 64 px), 7 Llama tokens (5 of them the caption's), CLIP's
    pooled output and the guidance value; the time is σ·1000."""
    import torch

    from onetrainer.tiny.denoiser_step import TIME_FRACTIONS

    config = model.config
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[:, 5:] = 0
    return {
        "hidden_states": randn(2, config.in_channels, 2, 8, 8),
        "timestep": torch.tensor(TIME_FRACTIONS) * 1000,
        "encoder_hidden_states": randn(2, 7, config.text_embed_dim),
        "encoder_attention_mask": mask,
        "pooled_projections": randn(2, config.pooled_projection_dim),
        "guidance": torch.full((2,), 1000.0),
    }


DENOISER_INPUTS = {"HunyuanVideoTransformer3DModel": transformer_inputs}
