"""The real models' configs (`onetrainer/families/reference_configs.py`) as the tiny builders use them, and the fields
a tiny model may change relative to them."""

from __future__ import annotations

from typing import Any

from onetrainer.families.reference_configs import *  # noqa: F403
from onetrainer.families.reference_configs import Config

# Fields a tiny model of a shared component kind may change relative to its reference config: widths, head and group
# counts, vocabulary and resolution. Anything else (block types, layer counts, attention placement, embeddings) must
# stay as in the real model. A family's tiny module adds the fields of its own components (`WIDTH_FIELDS`, and the
# block counts it may shrink, `DEPTH_FIELDS`): `width_fields`, `depth_fields`.
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
    "transformer": frozenset({"num_attention_heads", "attention_head_dim"}),
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
        }
    ),
}


def width_fields(kind: str) -> frozenset[str]:
    """The fields a tiny config of a component kind may change relative to its reference config: the shared
    components' (`TINY_WIDTH_FIELDS`) and those the tiny modules add for their own components."""
    from onetrainer.tiny.registry import tiny_modules

    own = (getattr(m, "WIDTH_FIELDS", {}).get(kind, frozenset()) for m in tiny_modules())
    return TINY_WIDTH_FIELDS.get(kind, frozenset()).union(*own)


def depth_fields(kind: str) -> frozenset[str]:
    """The block counts a tiny config of a component kind may shrink (where a variant's `depths` says so)."""
    from onetrainer.tiny.registry import tiny_modules

    return frozenset().union(*(getattr(m, "DEPTH_FIELDS", {}).get(kind, frozenset()) for m in tiny_modules()))


def nested_configs() -> frozenset[str]:
    """The keys under which a component's config nests another, whose width and depth fields are those of the kind
    of the same name."""
    from onetrainer.tiny.registry import tiny_modules

    return frozenset().union(*(getattr(m, "NESTED_CONFIGS", frozenset()) for m in tiny_modules()))


def with_depth(config: Config, depth: Config | None) -> Config:
    """`config` with the block counts of `depth` (a nested config's merged into it, not replacing it)."""
    merged: dict[str, Any] = {**config}
    for key, value in (depth or {}).items():
        merged[key] = with_depth(config[key], value) if key in nested_configs() else value
    return merged
