"""Z-Image (and Turbo): a single-stream transformer on Qwen3.

The declaration of `zimage.py`'s families (torch-free: the config and the GUI read it through
`config/model_types.py`): their model types, parts, formats, capabilities, layer presets, notes and sample defaults.
"""

from __future__ import annotations

from onetrainer.config.enums import ModelFormat, ModelType, NoiseScheduler, TrainingMethod
from onetrainer.config.family_info import (
    FLOW_MATCHING,
    LAYER_OFFLOADING,
    LAYER_SKIP,
    OWN_MODEL,
    FamilyInfo,
    FileCaveat,
    ModelTypeInfo,
    PartRole,
    SampleDefaults,
)
from onetrainer.families import reference_configs as ref
from onetrainer.families.lora_caveats import text_encoder_caveat
from onetrainer.util.layer_filter import RegexPatterns

# OneTrainer's Z-Image `attn-mlp`: the main layers' attention and feed-forward, not the refiners'.
_Z_IMAGE_LAYER_PRESETS = {
    "attn-mlp": RegexPatterns((r"^(?=.*attention)(?!.*refiner).*", r"^(?=.*feed_forward)(?!.*refiner).*")),
    "attn-only": RegexPatterns((r"^(?=.*attention)(?!.*refiner).*",)),
    "full": (),
}
Z_IMAGE = FamilyInfo(
    key="zimage",
    label="Z-Image",
    part_roles={"transformer": PartRole.DENOISER, "text_encoder": PartRole.TEXT_ENCODER, "vae": PartRole.IMAGE_ENCODER},
    bucket_step=16,
    sample_step=16,
    methods=(TrainingMethod.LORA, TrainingMethod.FINE_TUNE, TrainingMethod.EMBEDDING),
    output_formats={
        TrainingMethod.EMBEDDING: (ModelFormat.SAFETENSORS,),
        TrainingMethod.FINE_TUNE: (
            ModelFormat.DIFFUSERS,
            ModelFormat.ORIGINAL_TRANSFORMER,
            ModelFormat.COMFY_TRANSFORMER,
        ),
        TrainingMethod.LORA: (ModelFormat.DIFFUSERS_LORA, ModelFormat.COMFY_LORA),
    },
    muon_hidden_layers=("layers", "refiner"),
    layer_presets=_Z_IMAGE_LAYER_PRESETS,
    hub_parts=("transformer", "text_encoder", "vae"),
    capabilities=frozenset({LAYER_SKIP, FLOW_MATCHING}),
    part_capabilities={
        "transformer": frozenset({OWN_MODEL, LAYER_OFFLOADING}),
        "text_encoder": frozenset({LAYER_OFFLOADING}),
    },
    file_caveats=(
        text_encoder_caveat(
            "text_encoder",
            "diffusers' ZImagePipeline.load_lora_weights reads the transformer's part of a DIFFUSERS_LORA file, not "
            "the Qwen3 LoRA",
        ),
        FileCaveat(
            ModelFormat.ORIGINAL_TRANSFORMER,
            "ORIGINAL_TRANSFORMER writes the transformer in the names of Tongyi-MAI's release (diffusers' too), which "
            "diffusers' from_single_file, OneTrainer and this trainer read but ComfyUI does not: it loads such a file "
            "with missing and unexpected weights, warning only on its console. Save COMFY_TRANSFORMER for ComfyUI",
            method=TrainingMethod.FINE_TUNE,
        ),
    ),
    notes="`text_encoder` is Qwen3 (4B): each caption goes through its chat template as one user message, padded to "
    "512 tokens, and its second-to-last hidden states condition the transformer without the padding, as "
    "ZImagePipeline prompts it (clip skip counts further back). One model type covers Z-Image and Z-Image-Turbo; "
    "OneTrainer's presets train the Turbo model through a de-distilled transformer file given as "
    "`transformer.model_name` (a local file or a hub file URL, in diffusers' names or ComfyUI's layout). The "
    "transformer takes the time 1 - sigma and predicts the negative flow, as the pipeline reads it. Samples use "
    "classifier-free guidance with the negative prompt (Turbo: CFG scale 0, 8 steps). LoRA files: DIFFUSERS_LORA "
    "(diffusers' `load_lora_weights`) or COMFY_LORA (`diffusion_model.` + diffusers' module names, q/k/v apart: "
    "ComfyUI and diffusers both load it); fine-tunes as a diffusers folder or the transformer alone in the names of "
    "Tongyi-MAI's release, diffusers' too (ORIGINAL_TRANSFORMER, as OneTrainer writes it; ComfyUI does not read it) "
    "or in ComfyUI's layout (COMFY_TRANSFORMER, what ComfyUI's Load Diffusion Model reads).",
)
_Z_IMAGE_SAMPLE = SampleDefaults(1024, 1024, 28, 4.0, NoiseScheduler.EULER)

# The model types this module declares, in the order the model-type menu lists them.
MODEL_TYPES: tuple[ModelTypeInfo, ...] = (
    ModelTypeInfo(
        ModelType.Z_IMAGE,
        "Z-Image (Turbo)",
        Z_IMAGE,
        1024,
        False,
        False,
        _Z_IMAGE_SAMPLE,
        released_parts={
            "transformer": ref.Z_IMAGE_TRANSFORMER,
            "text_encoder": ref.QWEN3_4B_TEXT,
            "vae": ref.Z_IMAGE_VAE,
        },
    ),
)
