"""Tiny Flux.2 pipelines: double- and single-stream blocks over 2x2-patchified 32-channel latents, conditioned on three
layers of a language model: [klein]'s Qwen3, which reads prompts through Qwen3's chat template, or [dev]'s Mistral Small
3.2 (Mistral3ForConditionalGeneration with a one-block vision tower it never uses for text), which reads them after
FLUX.2's system message through Mistral's; [dev]'s transformer has the guidance embedding. Their full-size references
are the family's own declaration (`families/flux2_info.py`)."""

from __future__ import annotations

from typing import Any

from onetrainer.config.enums import ModelType
from onetrainer.families import flux2_info as real
from onetrainer.families import reference_configs as ref
from onetrainer.tiny import mistral3_text
from onetrainer.tiny.mistral3_text import tiny_mistral3_config
from onetrainer.tiny.mistral_tokenizer import MISTRAL_TOKENIZER
from onetrainer.tiny.qwen3_text import tiny_qwen3_config
from onetrainer.tiny.variant import TinyVariant

LISTING_ORDER = 10  # the order the tiny models were added in

# 2 heads of 16: the rotary embedding splits each head's width over its four position axes (time, row, column, text
# position), each an even number, as the real 32/32/32/32 split 128.
TRANSFORMER_HEADS = 2
HEAD_WIDTH = 16
ROPE_AXES = [4, 4, 4, 4]

# The transformer's text width (three text layers side by side) and rotary axes (they split the head width); Qwen3's
# grouped key/value heads and the heads' own width; Mistral3's language model (`text_config`) and vision tower
# (`vision_config`), nested: their own width fields are those of their kinds.
WIDTH_FIELDS = {
    "transformer": frozenset({"joint_attention_dim", "axes_dims_rope"}),
    "text_encoder": frozenset({"num_key_value_heads", "head_dim"}) | mistral3_text.WIDTH_FIELDS["text_encoder"],
    "text_config": mistral3_text.WIDTH_FIELDS["text_config"],
    "vision_config": mistral3_text.WIDTH_FIELDS["vision_config"],
}
DEPTH_FIELDS = {
    "transformer": frozenset({"num_layers", "num_single_layers"}),
    "text_encoder": frozenset({"num_hidden_layers"}) | mistral3_text.DEPTH_FIELDS["text_encoder"],
    "text_config": mistral3_text.DEPTH_FIELDS["text_config"],
    "vision_config": mistral3_text.DEPTH_FIELDS["vision_config"],
}
NESTED_CONFIGS = mistral3_text.NESTED_CONFIGS

# klein 4B's 5 double- and 20 single-stream blocks as 2 of each. Qwen3-4B keeps 28 of its 36 layers: the pipeline reads
# the outputs of layers 9, 18 and 27, and the 27th must stay an inner layer's output (the last hidden state is the
# final norm's), as in the real model; 28 is the fewest that does.
KLEIN_DEPTH = {"transformer": {"num_layers": 2, "num_single_layers": 2}, "text_encoder": {"num_hidden_layers": 28}}

# [dev]'s 8 double- and 48 single-stream blocks as 2 of each. Mistral Small keeps 31 of its 40 layers: the pipeline
# reads the outputs of layers 10, 20 and 30, the 30th an inner layer's output as in the real model; the vision tower
# 1 of its 24 blocks.
DEV_DEPTH = {
    "transformer": {"num_layers": 2, "num_single_layers": 2},
    "text_encoder": {"text_config": {"num_hidden_layers": 31}, "vision_config": {"num_hidden_layers": 1}},
}

VARIANTS = (
    TinyVariant(
        name="flux2-klein",
        model_type=ModelType.FLUX_2,
        pipeline_class="Flux2KleinPipeline",
        description="FLUX.2 [klein] base 4B: double- and single-stream blocks (2 + 2 of the real 5 + 20) modulated "
        "once per model, 4D rotary positions, Qwen3-4B text encoder (28 of 36 layers; the outputs of layers 9, 18 and "
        "27 side by side, prompts in Qwen3's chat template), 32-channel VAE normalised by its batch-norm statistics "
        "over 2x2 patches, flow-matching Euler; CFG samples (not distilled)",
        module=__name__,
        references={
            "transformer": real.FLUX2_KLEIN_4B_TRANSFORMER,
            "vae": real.FLUX2_VAE,
            "text_encoder": real.QWEN3_4B_CAUSAL_LM,
            "tokenizer": ref.QWEN3_TOKENIZER,  # klein's tokenizer/ is Qwen3's
            "scheduler": real.FLUX2_SCHEDULER,
        },
        depths=KLEIN_DEPTH,
    ),
    TinyVariant(
        name="flux2-dev",
        model_type=ModelType.FLUX_2,
        pipeline_class="Flux2Pipeline",
        description="FLUX.2 [dev]: [klein]'s blocks at [dev]'s layout (2 + 2 of the real 8 + 48) with the guidance "
        "embedding of a guidance-distilled model, Mistral Small 3.2 text encoder (Mistral3ForConditionalGeneration: "
        "31 of 40 language-model layers, the outputs of layers 10, 20 and 30 side by side, prompts after FLUX.2's "
        "system message in Mistral's chat template; a 1-block Pixtral vision tower, unused for text), the same VAE "
        "and scheduler; samples with embedded guidance (no CFG pass)",
        module=__name__,
        references={
            "transformer": real.FLUX2_DEV_TRANSFORMER,
            "vae": real.FLUX2_VAE,
            "text_encoder": real.MISTRAL3_SMALL_24B,
            "tokenizer": MISTRAL_TOKENIZER,
            "scheduler": real.FLUX2_SCHEDULER,
        },
        depths=DEV_DEPTH,
    ),
)


def tiny_transformer_config(variant: TinyVariant, text_width: int) -> dict[str, Any]:
    """The transformer at the tiny width; `joint_attention_dim` is three text layers side by side, as 7680 is three
    times Qwen3-4B's 2560."""
    from onetrainer.tiny import components

    return components.tiny_config(
        "transformer",
        variant.references["transformer"],
        depth=variant.depths.get("transformer"),
        num_attention_heads=TRANSFORMER_HEADS,
        attention_head_dim=HEAD_WIDTH,
        axes_dims_rope=ROPE_AXES,
        joint_attention_dim=3 * text_width,
    )


def build_pipeline(variant: TinyVariant, seed: int) -> Any:
    """The pipeline for `variant`: the transformer, the text_encoder (Qwen3 or Mistral3) and its tokenizer, the VAE
    (with batch-norm statistics of its own seed, as a trained VAE's are not 0 and 1), the scheduler."""
    import torch

    from onetrainer.tiny import components
    from onetrainer.tiny.mistral_tokenizer import build_mistral_tokenizer
    from onetrainer.tiny.qwen_tokenizer import build_qwen_tokenizer
    from onetrainer.util.threads import library_attribute

    refs = variant.references
    if refs["text_encoder"] is real.MISTRAL3_SMALL_24B:
        tokenizer = build_mistral_tokenizer()
        text_encoder = components.build(tiny_mistral3_config(variant, tokenizer), seed, "text_encoder")
        text_width = text_encoder.config.text_config.hidden_size
    else:
        tokenizer = build_qwen_tokenizer()
        text_encoder = components.build(tiny_qwen3_config(variant, tokenizer), seed, "text_encoder")
        text_width = text_encoder.config.hidden_size
    config = tiny_transformer_config(variant, text_width)
    vae = components.build(components.tiny_vae_config(refs["vae"], variant.resolution), seed, "vae")
    with components.seeded(seed, "vae.bn"), torch.no_grad():
        vae.bn.running_mean.copy_(0.3 * torch.randn_like(vae.bn.running_mean))
        vae.bn.running_var.copy_(torch.empty_like(vae.bn.running_var).uniform_(0.5, 2.0))
    return library_attribute("diffusers", variant.pipeline_class)(
        transformer=components.build(config, seed, "transformer"),
        scheduler=components.build_scheduler(refs["scheduler"]),
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
    )


def transformer_inputs(model: Any, randn: Any) -> dict[str, Any]:
    """8x8 latents (64 px) patchified 2x2 into 16 tokens of 128 channels, 12 text tokens; the time is the flow's
    sigma; positions (0, row, column, 0) for the image, (0, 0, 0, l) for the text."""
    import torch

    from onetrainer.tiny.denoiser_step import TIME_FRACTIONS

    config = model.config
    rows, columns, tokens = 4, 4, 12
    image_ids = torch.zeros(rows, columns, 4, dtype=torch.long)
    image_ids[..., 1] = torch.arange(rows)[:, None]
    image_ids[..., 2] = torch.arange(columns)[None, :]
    text_ids = torch.zeros(tokens, 4, dtype=torch.long)
    text_ids[:, 3] = torch.arange(tokens)
    inputs = {
        "hidden_states": randn(2, rows * columns, config.in_channels),
        "encoder_hidden_states": randn(2, tokens, config.joint_attention_dim),
        "timestep": torch.tensor(TIME_FRACTIONS),
        "img_ids": image_ids.reshape(-1, 4),
        "txt_ids": text_ids,
    }
    if config.guidance_embeds:
        inputs["guidance"] = torch.tensor([4.0, 1.0])
    return inputs


DENOISER_INPUTS = {"Flux2Transformer2DModel": transformer_inputs}


def store_extras(pipeline: Any, folder: Any, variant: TinyVariant) -> None:
    """The tokenizer as the hub's klein folders hold it (vocab.json and merges.txt, the chat template inside
    tokenizer_config.json); [dev]'s as a Mistral tokenizer folder (tokenizer.json, tokenizer_config.json,
    chat_template.jinja: the hub's PixtralProcessor folder holds those beside the image processor's files)."""
    import shutil

    from onetrainer.tiny.mistral_tokenizer import write_mistral_tokenizer_files
    from onetrainer.tiny.qwen_tokenizer import rewrite_qwen_tokenizer

    if variant.references["text_encoder"] is real.MISTRAL3_SMALL_24B:
        shutil.rmtree(folder / "tokenizer")
        write_mistral_tokenizer_files(folder / "tokenizer")
    else:
        rewrite_qwen_tokenizer(folder / "tokenizer", pipeline.tokenizer)
