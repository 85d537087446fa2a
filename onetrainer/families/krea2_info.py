"""Krea 2: a single-stream MMDiT on a stack of Qwen3-VL's hidden states, over Qwen-Image's VAE latents.

The declaration of `krea2.py`'s family (torch-free: the config and the GUI read it through `config/model_types.py`):
its model type, parts, formats, capabilities, layer presets, notes and sample defaults.
"""

from __future__ import annotations

from onetrainer.config.enums import ModelFormat, ModelType, NoiseScheduler, TrainingMethod
from onetrainer.config.family_info import (
    FLOW_MATCHING,
    LAYER_OFFLOADING,
    OWN_MODEL,
    FamilyInfo,
    ModelTypeInfo,
    PartRole,
    SampleDefaults,
)
from onetrainer.families import reference_configs as ref
from onetrainer.families.lora_caveats import text_encoder_caveat

KREA2 = FamilyInfo(
    key="krea2",
    label="Krea 2",
    part_roles={"transformer": PartRole.DENOISER, "text_encoder": PartRole.TEXT_ENCODER, "vae": PartRole.IMAGE_ENCODER},
    # the VAE downsamples 8x and the transformer takes 2x2 patches: a token is 16 px
    bucket_step=16,
    sample_step=16,
    methods=(TrainingMethod.LORA, TrainingMethod.FINE_TUNE, TrainingMethod.EMBEDDING),
    output_formats={
        TrainingMethod.LORA: (ModelFormat.DIFFUSERS_LORA, ModelFormat.KOHYA_LORA),
        TrainingMethod.FINE_TUNE: (ModelFormat.DIFFUSERS, ModelFormat.ORIGINAL_TRANSFORMER),
        TrainingMethod.EMBEDDING: (ModelFormat.SAFETENSORS,),
    },
    # OneTrainer's Krea 2 presets (BaseKrea2Setup.LAYER_PRESETS), matched as substrings of the module paths
    muon_hidden_layers=("transformer_blocks", "language_model.layers"),  # the DiT blocks, Qwen3-VL's decoder layers
    layer_presets={
        "attn-mlp": ("attn", "ff"),
        "attn-only": ("attn",),
        "blocks": ("transformer_blocks",),
        "full": (),
    },
    hub_parts=("transformer", "text_encoder", "vae"),
    capabilities=frozenset({FLOW_MATCHING}),
    part_capabilities={
        "transformer": frozenset({OWN_MODEL, LAYER_OFFLOADING}),
        "text_encoder": frozenset({LAYER_OFFLOADING}),
    },
    # OneTrainer runs Qwen3-VL outside float16 autocast (BaseKrea2Setup)
    float16_unsafe_parts=("text_encoder",),
    file_caveats=(
        text_encoder_caveat(
            "text_encoder",
            "diffusers' Krea2Pipeline.load_lora_weights reads the transformer's part of a DIFFUSERS_LORA file, not "
            "the Qwen3-VL LoRA",
        ),
    ),
    notes="`text_encoder` is Qwen3-VL (4B; its language model reads the captions): as Krea2Pipeline prompts it, "
    "each caption goes into Qwen-Image's prompt template, padded to 512 tokens before the template's closing "
    "assistant turn (positions count the caption's tokens only), and the hidden states of 12 of its layers (the "
    "pipeline's `text_encoder_select_layers`, from the base model's model_index.json) are stacked per token after "
    "the template's first 34 tokens; the transformer fuses them itself. The text cache keeps each caption's "
    "attended tokens. Caption dropout encodes the empty caption (the pipeline's negative prompt). The VAE is "
    "Qwen-Image's video VAE on single frames, its latents normalised per channel, packed 2x2; training is "
    "rectified flow (the transformer takes σ). Samples run Krea2Pipeline with classifier-free guidance: the CFG "
    "scale is the usual one (Krea's `guidance_scale` is CFG − 1), 1 turns it off (the distilled Turbo model, whose "
    "model_index.json says `is_distilled`, samples in 8 steps without it). LoRA files: DIFFUSERS_LORA "
    "(Krea2Pipeline's `load_lora_weights`) or KOHYA_LORA (`lora_unet_` / `lora_te1_` + the diffusers module path; "
    "LoHa and LoKr too). Fine-tunes: a diffusers folder (also the backup, usable as a base model) or the transformer "
    "alone in Krea's own names (ORIGINAL_TRANSFORMER, krea/Krea-2-Raw's raw.safetensors layout), which "
    "`transformer.model_name` reads back over a diffusers base (diffusers' names too).",
)
_KREA2_SAMPLE = SampleDefaults(1024, 1024, 28, 5.5, NoiseScheduler.EULER)

# The model types this module declares, in the order the model-type menu lists them.
MODEL_TYPES: tuple[ModelTypeInfo, ...] = (
    ModelTypeInfo(
        ModelType.KREA_2,
        "Krea 2",
        KREA2,
        1024,
        False,
        False,
        _KREA2_SAMPLE,
        released_parts={
            "transformer": ref.KREA2_TRANSFORMER,
            "text_encoder": ref.QWEN3_VL_4B_TEXT,
            "vae": ref.QWEN_IMAGE_VAE,
        },
    ),
)
