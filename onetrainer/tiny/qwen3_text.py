"""Qwen3 as a tiny text encoder, for the families that condition on it: their tiny modules build its config here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from onetrainer.tiny.variant import TinyVariant

# Qwen3 at a tiny width, in Qwen3-4B's proportions: queries wider than the model (8 heads of 8 over 32 channels, as
# 32 x 128 over 2560), a quarter as many key/value heads (grouped-query attention), a wide MLP.
TEXT_WIDTH = 32
TEXT_HEADS = 8
TEXT_KV_HEADS = 2
TEXT_HEAD_WIDTH = 8
TEXT_MLP_WIDTH = 128


def tiny_qwen3_config(variant: TinyVariant, tokenizer: Any) -> dict[str, Any]:
    """The variant's Qwen3 text encoder at the tiny width, with the tokenizer's vocabulary and its own ids of the
    reference's start / end tokens (the real 151643 is "<|endoftext|>", 151645 "<|im_end|>": a base model, as
    Anima's Qwen3-0.6B-Base, ends with its start token)."""
    from onetrainer.tiny import components

    reference = variant.references["text_encoder"]
    same_end = reference.get("eos_token_id") == reference.get("bos_token_id")
    return components.tiny_config(
        "text_encoder",
        variant.references["text_encoder"],
        depth=variant.depths.get("text_encoder"),
        hidden_size=TEXT_WIDTH,
        intermediate_size=TEXT_MLP_WIDTH,
        num_attention_heads=TEXT_HEADS,
        num_key_value_heads=TEXT_KV_HEADS,
        head_dim=TEXT_HEAD_WIDTH,
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.pad_token_id,  # "<|endoftext|>": Qwen3's config calls it the start token
        eos_token_id=tokenizer.pad_token_id if same_end else tokenizer.eos_token_id,
    )


def store_as_causal_lm(folder: Path) -> None:
    """A saved Qwen3Model folder as the hub's Qwen3 text encoders are: a Qwen3ForCausalLM checkpoint, its config naming
    that class and its files holding the weights under `model.` (the LM head is the tied embedding, not stored).
    Diffusers loads it as the bare Qwen3Model, and transformers strips the prefix on load, for either class."""
    import json

    from safetensors.torch import load_file, save_file

    for path in folder.glob("*.safetensors"):
        tensors = load_file(path)
        renamed = {k if k.startswith("model.") else f"model.{k}": v for k, v in tensors.items()}
        save_file(renamed, path, metadata={"format": "pt"})
    config_path = folder / "config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["architectures"] = ["Qwen3ForCausalLM"]
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
