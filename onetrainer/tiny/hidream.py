"""Tiny HiDream-I1 pipeline: double- and single-stream blocks whose feed-forwards are mixtures of experts, over 2x2
patches of the Flux VAE's 16-channel latents, conditioned on four text encoders: the pooled outputs of CLIP-L and
CLIP-G (Long-CLIP, 248 positions), T5's hidden states and one tapped layer of Llama-3.1's hidden states per block."""

from __future__ import annotations

from typing import Any

from onetrainer.config.enums import ModelType
from onetrainer.tiny import reference as ref
from onetrainer.tiny.reference import Config
from onetrainer.tiny.variant import TinyVariant

LISTING_ORDER = 17  # the order the tiny models were added in

# The transformer: 2 heads of 16 (the real 20 of 128), the rotary split 8/4/4 over (t, row, column) as 64/32/32 split
# 128; every block keeps its 4 routed experts (2 active) and the shared one. Latents up to 32x32 patches (the real
# 128x128): the pipeline pads a non-square image's patches to that many.
TRANSFORMER_HEADS = 2
HEAD_WIDTH = 16
ROPE_AXES = [8, 4, 4]
MAX_RESOLUTION = [32, 32]
# T5 and Llama at distinct tiny widths (the real ones are both 4096), so that a mix-up of the two shows.
T5_WIDTH = 32
LLAMA_WIDTH = 48
LLAMA_HEADS = 4
LLAMA_KV_HEADS = 1  # a quarter of the query heads, as 8 of 32
LLAMA_HEAD_WIDTH = 12
LLAMA_MLP_WIDTH = 96
# Every text encoder as 2 layers (CLIP-L 12, CLIP-G 32, T5 24, Llama 32); the transformer's 16 double- and 32
# single-stream blocks as one of each. The real blocks read Llama's layers 0-31 in order, the last again for the
# remaining 16: the tiny double block reads layer 0, the single block the last (1).
TEXT_LAYERS = 2
LLAMA_LAYERS = [0, 1]

WIDTH_FIELDS = {
    "transformer": frozenset({"caption_channels", "text_emb_dim", "axes_dims_rope", "max_resolution"}),
    "text_encoder": frozenset({"num_key_value_heads", "head_dim"}),
}
DEPTH_FIELDS = {
    "transformer": frozenset({"num_single_layers", "llama_layers"}),
    "text_encoder": frozenset({"num_hidden_layers", "num_layers"}),
}

HIDREAM_DEPTH = {
    "transformer": {"num_layers": 1, "num_single_layers": 1, "llama_layers": LLAMA_LAYERS},
    "text_encoder": {"num_hidden_layers": TEXT_LAYERS},
    "text_encoder_2": {"num_hidden_layers": TEXT_LAYERS},
    "text_encoder_3": {"num_layers": TEXT_LAYERS},
    "text_encoder_4": {"num_hidden_layers": TEXT_LAYERS},
}

VARIANTS = (
    TinyVariant(
        name="hidream",
        model_type=ModelType.HI_DREAM_FULL,
        pipeline_class="HiDreamImagePipeline",
        description="HiDream-I1-Full: double- and single-stream blocks (1 of the real 16 and 1 of 32) with "
        "mixture-of-experts feed-forwards (4 routed, 2 active, 1 shared), Long-CLIP-L and -G pooled, T5 v1.1 XXL and "
        "Llama-3.1-8B-Instruct (each 2 of its layers; one tapped Llama layer per block), Flux's 16-channel VAE, "
        "flow-matching UniPC at shift 3",
        module=__name__,
        references={
            "transformer": ref.HIDREAM_I1_TRANSFORMER,
            "vae": ref.FLUX_VAE,
            "text_encoder": ref.LONG_CLIP_L_PROJECTED_TEXT,
            "tokenizer": ref.CLIP_TOKENIZER,
            "text_encoder_2": ref.LONG_CLIP_G_PROJECTED_TEXT,
            "tokenizer_2": ref.CLIP_TOKENIZER,
            "text_encoder_3": ref.T5_XXL_ENCODER,
            "tokenizer_3": ref.T5_TOKENIZER,
            "text_encoder_4": ref.LLAMA31_8B_TEXT,
            "tokenizer_4": ref.LLAMA3_TOKENIZER,
            "scheduler": ref.HIDREAM_I1_FULL_SCHEDULER,
        },
        depths=HIDREAM_DEPTH,
        # Llama is its own model in HiDream-I1's configs (`text_encoder_4.model_name`, OneTrainer's preset names the
        # hub's): the tiny base brings the tiny one as such a folder
        own_parts=("text_encoder_4",),
    ),
)


def _clip(variant: TinyVariant, seed: int, suffix: str) -> tuple[Any, Any]:
    from onetrainer.tiny import components
    from onetrainer.tiny.reference import with_depth
    from onetrainer.tiny.tokenizer import build_clip_tokenizer

    refs = variant.references
    tokenizer = build_clip_tokenizer(pad_token=refs[f"tokenizer{suffix}"]["pad_token"])
    real = with_depth(refs[f"text_encoder{suffix}"], variant.depths.get(f"text_encoder{suffix}"))
    return tokenizer, components.build(components.tiny_clip_text_config(real, tokenizer), seed, f"text_encoder{suffix}")


def tiny_t5_config(variant: TinyVariant, tokenizer: Any) -> Config:
    from onetrainer.tiny import components

    real = variant.references["text_encoder_3"]
    return {**components.tiny_t5_config(real, tokenizer, T5_WIDTH), **variant.depths["text_encoder_3"]}


def tiny_llama_config(variant: TinyVariant, tokenizer: Any) -> Config:
    """Llama-3.1 at the tiny width, with the tokenizer's vocabulary and its ids of the start and end tokens (the real
    128000 and [128001, 128008, 128009] are the same tokens' ids in the full vocabulary)."""
    from onetrainer.tiny import components

    ends = ("<|end_of_text|>", "<|eom_id|>", "<|eot_id|>")
    return components.tiny_config(
        "text_encoder",
        variant.references["text_encoder_4"],
        depth=variant.depths.get("text_encoder_4"),
        hidden_size=LLAMA_WIDTH,
        intermediate_size=LLAMA_MLP_WIDTH,
        num_attention_heads=LLAMA_HEADS,
        num_key_value_heads=LLAMA_KV_HEADS,
        head_dim=LLAMA_HEAD_WIDTH,
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=[tokenizer.convert_tokens_to_ids(t) for t in ends],
    )


def tiny_transformer_config(variant: TinyVariant, pooled_width: int) -> Config:
    from onetrainer.tiny import components

    return components.tiny_config(
        "transformer",
        variant.references["transformer"],
        depth=variant.depths.get("transformer"),
        num_attention_heads=TRANSFORMER_HEADS,
        attention_head_dim=HEAD_WIDTH,
        caption_channels=[T5_WIDTH, LLAMA_WIDTH],
        text_emb_dim=pooled_width,
        axes_dims_rope=ROPE_AXES,
        max_resolution=MAX_RESOLUTION,
    )


def build_pipeline(variant: TinyVariant, seed: int) -> Any:
    """The pipeline for `variant`: CLIP-L, CLIP-G, T5 and Llama with their tokenizers, the transformer, the VAE and
    the scheduler."""
    from onetrainer.tiny import components
    from onetrainer.tiny.llama_tokenizer import build_llama_tokenizer
    from onetrainer.tiny.t5_tokenizer import build_t5_tokenizer
    from onetrainer.util.threads import library_attribute

    refs = variant.references
    tokenizer, text_encoder = _clip(variant, seed, "")
    tokenizer_2, text_encoder_2 = _clip(variant, seed, "_2")
    tokenizer_3 = build_t5_tokenizer()
    text_encoder_3 = components.build(tiny_t5_config(variant, tokenizer_3), seed, "text_encoder_3")
    tokenizer_4 = build_llama_tokenizer()
    text_encoder_4 = components.build(tiny_llama_config(variant, tokenizer_4), seed, "text_encoder_4")
    pooled = text_encoder.config.projection_dim + text_encoder_2.config.projection_dim
    return library_attribute("diffusers", variant.pipeline_class)(
        transformer=components.build(tiny_transformer_config(variant, pooled), seed, "transformer"),
        scheduler=components.build_scheduler(refs["scheduler"]),
        vae=components.build_vae(components.tiny_vae_config(refs["vae"], variant.resolution), seed),
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        text_encoder_2=text_encoder_2,
        tokenizer_2=tokenizer_2,
        text_encoder_3=text_encoder_3,
        tokenizer_3=tokenizer_3,
        text_encoder_4=text_encoder_4,
        tokenizer_4=tokenizer_4,
    )


def transformer_inputs(model: Any, randn: Any) -> dict[str, Any]:
    """8x8 latents (64 px), 6 T5 tokens, 5 Llama tokens per tapped layer, the CLIPs' pooled outputs; the time is the
    flow's σ·1000."""
    import torch

    from onetrainer.tiny.denoiser_step import TIMESTEPS

    config = model.config
    layers = max(config.llama_layers) + 1
    return {
        "hidden_states": randn(2, config.in_channels, 8, 8),
        "timesteps": torch.tensor(TIMESTEPS),
        "encoder_hidden_states_t5": randn(2, 6, config.caption_channels[0]),
        "encoder_hidden_states_llama3": randn(layers, 2, 5, config.caption_channels[1]),
        "pooled_embeds": randn(2, config.text_emb_dim),
    }


DENOISER_INPUTS = {"HiDreamImageTransformer2DModel": transformer_inputs}


def store_extras(pipeline: Any, folder, variant: TinyVariant) -> None:
    """Llama's tokenizer as the hub's folder holds it (the pipeline gives it the end token as its padding token, which
    the real files do not name)."""
    import shutil

    from onetrainer.tiny.llama_tokenizer import write_llama_tokenizer_files

    shutil.rmtree(folder / "tokenizer_4")
    write_llama_tokenizer_files(folder / "tokenizer_4")


def build_own_part(variant: TinyVariant, part: str):
    """The tiny Llama as a model folder of its own (the model and its tokenizer, as a hub Llama repository holds
    them), beside the tiny pipeline's folder in the cache, made from its `text_encoder_4` and `tokenizer_4` once."""
    import os
    import shutil

    from onetrainer.tiny.storage import tiny_model_dir

    base = tiny_model_dir(variant.name)
    folder = base.with_name(f"{base.name}-{part}")
    if (folder / "config.json").is_file():
        return folder
    building = folder.with_name(f"{folder.name}.building-{os.getpid()}")
    shutil.rmtree(building, ignore_errors=True)
    shutil.copytree(base / "text_encoder_4", building)
    for file in (base / "tokenizer_4").iterdir():
        shutil.copy(file, building / file.name)
    try:
        building.rename(folder)
    except OSError:  # another process put it in place first
        shutil.rmtree(building, ignore_errors=True)
    return folder
