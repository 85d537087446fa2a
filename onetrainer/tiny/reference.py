"""The real models' configs (`onetrainer/families/reference_configs.py`) as the tiny builders use them, and the fields
a tiny model may change relative to them."""

from __future__ import annotations

from onetrainer.families.reference_configs import *  # noqa: F403
from onetrainer.families.reference_configs import Config  # noqa: F401

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
    "vae": frozenset({"block_out_channels", "norm_num_groups", "sample_size"}),
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
        }
    ),
}

# Fields a tiny model may also shrink where the variant declares it (`TinyVariant.depths`): how often a block repeats.
# Every key pattern of the real checkpoint is still there (block 0 and block 1 of each kind); the topology tests
# compare the keys with the real model's at the same depth, and with its block indices left out, at full depth.
# SD 3.5 Medium's dual-attention blocks are the first 13 of its 24: the tiny model's first of two. Z-Image's main blocks
# are `n_layers` (its 2 + 2 refiner blocks stay); its Qwen3 text encoder repeats one decoder layer 36 times.
TINY_DEPTH_FIELDS: dict[str, frozenset[str]] = {
    "transformer": frozenset({"num_layers", "num_single_layers", "dual_attention_layers", "n_layers"}),
    "text_encoder": frozenset({"num_hidden_layers"}),
}
