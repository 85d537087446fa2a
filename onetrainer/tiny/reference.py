"""The real models' configs (`onetrainer/families/reference_configs.py`) as the tiny builders use them, and the fields
a tiny model may change relative to them."""

from __future__ import annotations

from typing import Any

from onetrainer.families.reference_configs import *  # noqa: F403
from onetrainer.families.reference_configs import Config

# Fields a tiny model may change relative to its reference config: widths, head and group counts, vocabulary and
# resolution. Anything else (block types, layer counts, attention placement, embeddings) must stay as in the real model.
TINY_WIDTH_FIELDS: dict[str, frozenset[str]] = {
    "unet": frozenset(
        {
            "block_out_channels",
            "attention_head_dim",
            "cross_attention_dim",
            "projection_class_embeddings_input_dim",
            "norm_num_groups",
            "sample_size",
        }
    ),
    # `base_dim`: Qwen-Image's VAE, whose level widths are multiples of it
    "vae": frozenset({"block_out_channels", "norm_num_groups", "sample_size", "base_dim"}),
    "vqgan": frozenset({"embed_dim", "num_vq_embeddings"}),
    "image_encoder": frozenset({"hidden_size", "intermediate_size", "num_attention_heads", "projection_dim"}),
    # Würstchen's prior and decoder; Stable Cascade's prior and decoder UNets.
    "prior": frozenset(
        {
            "c",
            "c_cond",
            "nhead",
            "block_out_channels",
            "num_attention_heads",
            "conditioning_dim",
            "clip_text_in_channels",
            "clip_text_pooled_in_channels",
            "clip_image_in_channels",
        }
    ),
    "decoder": frozenset(
        {
            "c_hidden",
            "c_cond",
            "nhead",
            "clip_embd",
            "block_out_channels",
            "num_attention_heads",
            "conditioning_dim",
            "clip_text_pooled_in_channels",
        }
    ),
    "transformer": frozenset(
        {
            "num_attention_heads",
            "attention_head_dim",
            # PixArt
            "cross_attention_dim",
            "caption_channels",
            # Flux and Chroma: the text inputs' widths, the rotary axes (they split the head width), the approximator
            "joint_attention_dim",
            "pooled_projection_dim",
            # Stable Diffusion 3: the text's projected width (the transformer's own) and the position table's side
            "caption_projection_dim",
            "pos_embed_max_size",
            "axes_dims_rope",
            "approximator_hidden_dim",
            # Z-Image: the width, its heads (the rotary axes split each head's width) and the text encoder's width
            # (Qwen-Image's are Flux's fields: heads, head width, rotary axes, `joint_attention_dim`)
            "dim",
            "n_heads",
            "n_kv_heads",
            "axes_dims",
            "cap_feat_dim",
        }
    ),
    "text_encoder": frozenset(
        {
            # CLIP
            "hidden_size",
            "intermediate_size",
            "projection_dim",
            "num_attention_heads",
            "vocab_size",
            "bos_token_id",
            "eos_token_id",
            "pad_token_id",
            # T5
            "d_model",
            "d_ff",
            "d_kv",
            "num_heads",
            # Qwen3: grouped key/value heads, and the heads' own width (wider than the model in Qwen3-4B)
            "num_key_value_heads",
            "head_dim",
            # Qwen2.5-VL: the multimodal rotary sections (`rope_scaling.mrope_section`, which split each head's
            # frequencies), the vision placeholders' token ids, and the vision tower (`vision_config`, whose own
            # width fields are its kind's)
            "rope_scaling",
            "image_token_id",
            "video_token_id",
            "vision_start_token_id",
            "vision_end_token_id",
            "vision_token_id",
            "vision_config",
        }
    ),
    # Qwen2.5-VL's vision tower, nested in its text encoder's config: width, heads, MLP, the merged tokens' width (the
    # decoder's)
    "vision_config": frozenset({"hidden_size", "intermediate_size", "num_heads", "out_hidden_size"}),
}

# Configs nested in a component's config under these keys (Qwen2.5-VL's vision tower in its text encoder's): their
# width and depth fields are those of the kind of the same name.
NESTED_CONFIGS = frozenset({"vision_config"})

# Fields a tiny model may also shrink where the variant declares it (`TinyVariant.depths`): how often a block repeats.
# Every key pattern of the real checkpoint is still there (block 0 and block 1 of each kind); the topology tests
# compare the keys with the real model's at the same depth, and with its block indices left out, at full depth.
# SD 3.5 Medium's dual-attention blocks are the first 13 of its 24: the tiny model's first of two. Z-Image's main blocks
# are `n_layers` (its 2 + 2 refiner blocks stay); its Qwen3 text encoder repeats one decoder layer 36 times.
# Qwen2.5-VL's vision tower repeats one block 32 times, every eighth with full attention (`fullatt_block_indexes`, the
# rest windowed): the tiny one keeps one of each.
TINY_DEPTH_FIELDS: dict[str, frozenset[str]] = {
    "transformer": frozenset({"num_layers", "num_single_layers", "dual_attention_layers", "n_layers"}),
    "text_encoder": frozenset({"num_hidden_layers", "vision_config"}),
    "vision_config": frozenset({"depth", "fullatt_block_indexes"}),
}


def with_depth(config: Config, depth: Config | None) -> Config:
    """`config` with the block counts of `depth` (a nested config's merged into it, not replacing it)."""
    merged: dict[str, Any] = {**config}
    for key, value in (depth or {}).items():
        merged[key] = with_depth(config[key], value) if key in NESTED_CONFIGS else value
    return merged
