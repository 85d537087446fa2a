"""Qwen-Image and its edit models: a dual-stream transformer on Qwen2.5-VL's language model.

The declaration of `qwen.py`'s families (torch-free: the config and the GUI read it through
`config/model_types.py`): their model types, parts, formats, capabilities, layer presets, notes and sample defaults.
"""

from __future__ import annotations

import dataclasses

from onetrainer.config.enums import ModelFormat, ModelType, NoiseScheduler, TrainingMethod
from onetrainer.config.family_info import (
    FLOW_MATCHING,
    LAYER_OFFLOADING,
    LAYER_SKIP,
    OWN_MODEL,
    REFERENCE_IMAGES,
    FamilyInfo,
    ModelTypeInfo,
    PartRole,
    SampleDefaults,
)
from onetrainer.families import reference_configs as ref
from onetrainer.families.lora_caveats import text_encoder_caveat

QWEN = FamilyInfo(
    key="qwen",
    label="Qwen-Image",
    part_roles={"transformer": PartRole.DENOISER, "text_encoder": PartRole.TEXT_ENCODER, "vae": PartRole.IMAGE_ENCODER},
    bucket_step=16,
    sample_step=16,
    methods=(TrainingMethod.LORA, TrainingMethod.FINE_TUNE, TrainingMethod.EMBEDDING),
    output_formats={
        TrainingMethod.FINE_TUNE: (ModelFormat.DIFFUSERS, ModelFormat.ORIGINAL_TRANSFORMER),
        TrainingMethod.LORA: (ModelFormat.DIFFUSERS_LORA, ModelFormat.COMFY_LORA),
        TrainingMethod.EMBEDDING: (ModelFormat.SAFETENSORS,),
    },
    # OneTrainer's Qwen presets
    muon_hidden_layers=("transformer_blocks", "model.layers"),  # Qwen2.5-VL language model layers
    layer_presets={
        "attn-mlp": ("attn", "img_mlp", "txt_mlp"),
        "attn-only": ("attn",),
        "blocks": ("transformer_block",),
        "full": (),
    },
    hub_parts=("transformer", "text_encoder", "vae"),
    capabilities=frozenset({LAYER_SKIP, FLOW_MATCHING}),
    part_capabilities={
        "transformer": frozenset({OWN_MODEL, LAYER_OFFLOADING}),
        "text_encoder": frozenset({LAYER_OFFLOADING}),
    },
    file_caveats=(
        text_encoder_caveat(
            "text_encoder",
            "diffusers' QwenImagePipeline.load_lora_weights reads the transformer's part of a DIFFUSERS_LORA file, "
            "not the Qwen2.5-VL LoRA",
        ),
    ),
    notes="`text_encoder` is the language model of Qwen2.5-VL (7B): each caption goes into Qwen-Image's prompt "
    "template (a system line asking to describe the image, then the caption), padded to 512 tokens after the "
    "template's first 34, which the pipeline drops; its last hidden states condition the transformer with their "
    "mask (clip skip counts back from there). The VAE is Qwen-Image's video VAE on single frames, its latents "
    "normalised per channel. Samples use true classifier-free guidance (the CFG scale, the negative prompt). LoRA "
    "files: DIFFUSERS_LORA or COMFY_LORA (`diffusion_model.` + the module names ComfyUI and diffusers share); "
    "fine-tunes as a diffusers folder or the transformer alone in those names (ORIGINAL_TRANSFORMER).",
)
QWEN_EDIT = dataclasses.replace(
    QWEN,
    key="qwen_edit",
    label="Qwen-Image-Edit",
    reference_images=True,
    text_reads_references=True,  # Qwen2.5-VL sees the pictures with the instruction
    capabilities=QWEN.capabilities | {REFERENCE_IMAGES},
    notes="The edit models (Qwen-Image-Edit-2509, -2511) learn to change reference images as the caption says: "
    "the training image is the result, its reference images (`<name>-reference.<ext>`, or `<name>-reference-1.<ext>`, "
    "`-2`, … for several, each of its own size) the inputs; an image without one is skipped and named. Each "
    "reference goes to Qwen2.5-VL at about 384x384 px as a picture before the caption and to the VAE at about "
    "1024x1024 px, its latents joining the transformer's sequence, as QwenImageEditPlusPipeline feeds them; the loss "
    "covers the result's tokens. The references are cached with their image (their latents; with a frozen text "
    "encoder, its output per caption and references), keyed by their files, so changing a reference re-encodes its "
    "image; train with batch size 1 unless every image's references have the same sizes. Samples need the sample's "
    "`reference_images`. Embeddings are Qwen-Image's (key qwen25_7b), learnt with the references beside the caption. "
    "Otherwise as Qwen-Image.",
)
_QWEN_SAMPLE = SampleDefaults(1024, 1024, 30, 4.0, NoiseScheduler.EULER)

# The released models' parts as their diffusers configs (what the estimate counts a hub model not yet downloaded as).
_QWEN_PARTS = {
    "transformer": ref.QWEN_IMAGE_TRANSFORMER,
    "text_encoder": ref.QWEN25_VL_7B_TEXT,
    "vae": ref.QWEN_IMAGE_VAE,
}

# The model types this module declares, in the order the model-type menu lists them.
MODEL_TYPES: tuple[ModelTypeInfo, ...] = (
    ModelTypeInfo(ModelType.QWEN, "Qwen-Image", QWEN, 1024, False, False, _QWEN_SAMPLE, released_parts=_QWEN_PARTS),
    ModelTypeInfo(
        ModelType.QWEN_EDIT,
        "Qwen-Image-Edit (2509, 2511)",
        QWEN_EDIT,
        1024,
        False,
        False,
        _QWEN_SAMPLE,
        released_parts=_QWEN_PARTS,
    ),
)
