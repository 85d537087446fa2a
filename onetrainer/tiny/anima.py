"""Tiny Anima pipeline (`AnimaModularPipeline`): the Cosmos-Predict2 DiT over one-frame 16-channel latents of
Qwen-Image's video VAE, conditioned through the LLM adapter (T5 token ids as its queries) on Qwen3's last hidden
states. Written as diffusers' modular pipelines are: `modular_model_index.json` beside the components' subfolders."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from onetrainer.config.enums import ModelType
from onetrainer.tiny import reference as ref
from onetrainer.tiny.qwen3_text import store_as_causal_lm, tiny_qwen3_config
from onetrainer.tiny.variant import TinyVariant

LISTING_ORDER = 14  # the order the tiny models were added in

HUB_ID = "circlestone-labs/Anima-Base-v1.0-Diffusers"  # what the released folder's index names its components by

# The DiT: 2 heads of 16 (the rotary embedding splits each head's width 8/4/4 over frame, row and column, as 128 is
# split 44/42/42), the text 32 wide (the adapter's output), a 8-wide AdaLN low-rank branch (the real 256 of 2048).
TRANSFORMER_HEADS = 2
HEAD_WIDTH = 16
ADALN_WIDTH = 8
# The adapter: 2 heads of 16 over its 32 channels, its own width the text's (1024 = 1024 = 1024 in the real one).
ADAPTER_HEADS = 2
# The VAE's first level width (the real 96); the others are its multiples, as there.
VAE_BASE_WIDTH = 16

WIDTH_FIELDS = {
    "transformer": frozenset({"text_embed_dim", "adaln_lora_dim"}),
    "text_encoder": frozenset({"num_key_value_heads", "head_dim"}),
    "text_conditioner": frozenset(
        {"source_dim", "target_dim", "model_dim", "num_attention_heads", "target_vocab_size"}
    ),
}
DEPTH_FIELDS = {
    "transformer": frozenset({"num_layers"}),
    "text_encoder": frozenset({"num_hidden_layers"}),
    "text_conditioner": frozenset({"num_layers"}),
}

# Cosmos-Predict2-2B's 28 blocks as 2, Qwen3-0.6B's 28 decoder layers as 2 (its last hidden states feed the adapter),
# the adapter's 6 blocks as 2.
ANIMA_DEPTH = {
    "transformer": {"num_layers": 2},
    "text_encoder": {"num_hidden_layers": 2},
    "text_conditioner": {"num_layers": 2},
}

VARIANTS = (
    TinyVariant(
        name="anima",
        model_type=ModelType.ANIMA,
        pipeline_class="AnimaModularPipeline",
        description="Anima (circlestone-labs/Anima): Cosmos-Predict2 DiT blocks (2 of the real 28; self-attention, "
        "cross-attention, MLP, AdaLN with a low-rank branch, 3D rotary positions, the padding mask as an input "
        "channel), Qwen3-0.6B text encoder (2 of 28 layers) through the LLM adapter (2 of 6 blocks, T5 token ids as "
        "its queries), Qwen-Image's 16-channel video VAE on single frames, flow-matching Euler at shift 3; CFG with "
        "negative prompts",
        module=__name__,
        references={
            "transformer": ref.ANIMA_TRANSFORMER,
            "text_conditioner": ref.ANIMA_TEXT_CONDITIONER,
            "vae": ref.QWEN_IMAGE_VAE,
            "text_encoder": ref.QWEN3_06B_TEXT,
            "tokenizer": ref.QWEN3_TOKENIZER,
            "t5_tokenizer": ref.T5_TOKENIZER,
            "scheduler": ref.ANIMA_SCHEDULER,
        },
        depths=ANIMA_DEPTH,
    ),
)


def build_pipeline(variant: TinyVariant, seed: int) -> Any:
    """The modular pipeline for `variant`: the DiT, Qwen3 and its tokenizer, the adapter and the T5 tokenizer, the
    VAE, the scheduler."""
    from diffusers import AnimaAutoBlocks

    from onetrainer.tiny import components
    from onetrainer.tiny.qwen_tokenizer import build_qwen_tokenizer
    from onetrainer.tiny.t5_tokenizer import build_t5_tokenizer

    refs = variant.references
    tokenizer, t5_tokenizer = build_qwen_tokenizer(), build_t5_tokenizer()
    text_encoder = components.build(tiny_qwen3_config(variant, tokenizer), seed, "text_encoder")
    width = text_encoder.config.hidden_size
    adapter = components.tiny_config(
        "text_conditioner",
        refs["text_conditioner"],
        depth=variant.depths.get("text_conditioner"),
        source_dim=width,
        target_dim=width,
        model_dim=width,
        num_attention_heads=ADAPTER_HEADS,
        target_vocab_size=len(t5_tokenizer),
    )
    transformer = components.tiny_config(
        "transformer",
        refs["transformer"],
        depth=variant.depths.get("transformer"),
        num_attention_heads=TRANSFORMER_HEADS,
        attention_head_dim=HEAD_WIDTH,
        text_embed_dim=width,
        adaln_lora_dim=ADALN_WIDTH,
    )
    vae = components.tiny_config("vae", refs["vae"], base_dim=VAE_BASE_WIDTH)
    pipe = AnimaAutoBlocks().init_pipeline()
    pipe.update_components(
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        t5_tokenizer=t5_tokenizer,
        text_conditioner=components.build(adapter, seed, "text_conditioner"),
        transformer=components.build(transformer, seed, "transformer"),
        vae=components.build(vae, seed, "vae"),
        scheduler=components.build_scheduler(refs["scheduler"]),
    )
    return pipe


def save_pipeline(pipeline: Any, folder: Path) -> None:
    """As the released folder: each component in its subfolder, `modular_model_index.json` naming them by the hub
    repository (diffusers reads a local copy's own subfolders), Qwen3 as the hub's Qwen3 checkpoints are
    (`qwen3_text.store_as_causal_lm`), the tokenizer in the hub's layout."""
    from onetrainer.tiny.qwen_tokenizer import rewrite_qwen_tokenizer
    from onetrainer.util.quiet import no_progress_bars

    with no_progress_bars():
        pipeline.save_pretrained(str(folder), safe_serialization=True, overwrite_modular_index=True)
    index_file = folder / "modular_model_index.json"
    index = json.loads(index_file.read_text(encoding="utf-8"))
    for entry in index.values():
        if isinstance(entry, list) and len(entry) == 3 and isinstance(entry[2], dict):
            entry[2]["pretrained_model_name_or_path"] = HUB_ID
    index_file.write_text(json.dumps(index, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    store_as_causal_lm(folder / "text_encoder")
    rewrite_qwen_tokenizer(folder / "tokenizer", pipeline.tokenizer)


def transformer_inputs(model: Any, randn: Any) -> dict[str, Any]:
    """8x8 latents (64 px) as one frame with the all-zero padding mask in pixels, 12 text tokens of the adapter's
    width (the transformer takes no text mask). The time is the flow's sigma."""
    import torch

    from onetrainer.families.anima import allow_padding_mask_resize
    from onetrainer.tiny.denoiser_step import TIME_FRACTIONS

    allow_padding_mask_resize()
    config = model.config
    return {
        "hidden_states": randn(2, config.in_channels, 1, 8, 8),
        "encoder_hidden_states": randn(2, 12, config.text_embed_dim),
        "timestep": torch.tensor(TIME_FRACTIONS),
        "padding_mask": torch.zeros(1, 1, 64, 64),
    }


DENOISER_INPUTS = {"CosmosTransformer3DModel": transformer_inputs}
