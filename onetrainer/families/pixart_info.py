"""PixArt-Alpha / Sigma: a DiT with learned variance on one T5 text encoder.

The declaration of `pixart.py`'s families (torch-free: the config and the GUI read it through
`config/model_types.py`): their model types, parts, formats, capabilities, layer presets, notes and sample defaults.
"""

from __future__ import annotations

from onetrainer.config.enums import ModelFormat, ModelType, NoiseScheduler, TrainingMethod
from onetrainer.config.family_info import (
    ALL_METHODS,
    LAYER_OFFLOADING,
    LAYER_SKIP,
    LEARNED_VARIANCE,
    OWN_MODEL,
    FamilyInfo,
    ModelTypeInfo,
    PartRole,
    SampleDefaults,
)
from onetrainer.families import reference_configs as ref
from onetrainer.families.lora_caveats import text_encoder_caveat

PIXART = FamilyInfo(
    key="pixart",
    sample_step=16,
    label="PixArt-Alpha / Sigma",
    part_roles={"transformer": PartRole.DENOISER, "text_encoder": PartRole.TEXT_ENCODER, "vae": PartRole.IMAGE_ENCODER},
    bucket_step=16,
    methods=ALL_METHODS,
    output_formats={
        TrainingMethod.FINE_TUNE: (
            ModelFormat.DIFFUSERS,
            ModelFormat.ORIGINAL_TRANSFORMER,
            ModelFormat.LEGACY_SAFETENSORS,
        ),
        TrainingMethod.LORA: (ModelFormat.DIFFUSERS_LORA, ModelFormat.KOHYA_LORA, ModelFormat.LEGACY_LORA),
        TrainingMethod.EMBEDDING: (ModelFormat.SAFETENSORS,),
    },
    muon_hidden_layers=("transformer_blocks", "encoder.block"),
    layer_presets={
        "attn-mlp": ("attn1", "attn2", "ff"),
        "attn-only": ("attn1", "attn2"),
        "blocks": ("transformer_block",),
        "full": (),
    },
    hub_parts=("transformer", "text_encoder", "vae"),
    capabilities=frozenset({LEARNED_VARIANCE, LAYER_SKIP}),
    file_caveats=(
        text_encoder_caveat(
            "text_encoder", "diffusers' PixArt pipelines have no load_lora_weights (peft reads the T5 LoRA)"
        ),
    ),
    part_capabilities={
        "transformer": frozenset({OWN_MODEL, LAYER_OFFLOADING}),
        "text_encoder": frozenset({LAYER_OFFLOADING}),
        "vae": frozenset({OWN_MODEL}),
    },
    notes="`vb_loss_strength` (Training tab, Loss) weights the loss on the transformer's learned variance "
    "(OneTrainer's name and default, 1.0); 0 trains only the noise prediction. The transformer is the `transformer` "
    "block; the T5 text encoder is large, so the presets keep it frozen in BFLOAT_16. The 512 presets start from "
    "PixArt-XL-2-512x512, the others from PixArt-XL-2-1024-MS.",
)
_PIXART_SAMPLE = SampleDefaults(1024, 1024, 25, 4.5, NoiseScheduler.DDIM)

# The model types this module declares, in the order the model-type menu lists them.
MODEL_TYPES: tuple[ModelTypeInfo, ...] = (
    ModelTypeInfo(
        ModelType.PIXART_ALPHA,
        "PixArt-Alpha",
        PIXART,
        1024,
        False,
        False,
        _PIXART_SAMPLE,
        released_parts={
            "transformer": ref.PIXART_ALPHA_TRANSFORMER,
            "text_encoder": ref.T5_XXL_ENCODER,
            "vae": ref.SD_VAE,
        },
    ),
    ModelTypeInfo(ModelType.PIXART_SIGMA, "PixArt-Sigma", PIXART, 1024, False, False, _PIXART_SAMPLE),
)
