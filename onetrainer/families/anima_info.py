"""Anima: NVIDIA's Cosmos-Predict2 DiT conditioned on Qwen3-0.6B through an LLM adapter, over Qwen-Image's VAE.

The declaration of `anima.py`'s family (torch-free: the config and the GUI read it through `config/model_types.py`):
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

ANIMA = FamilyInfo(
    key="anima",
    label="Anima",
    # `text_encoder` is Qwen3-0.6B together with the LLM adapter that turns its states into the transformer's text
    # (diffusers' `text_conditioner`): they run, move and cache as one
    part_roles={"transformer": PartRole.DENOISER, "text_encoder": PartRole.TEXT_ENCODER, "vae": PartRole.IMAGE_ENCODER},
    # the VAE downsamples 8x and the transformer takes 2x2 patches: a token is 16 px (the pipeline's own check)
    bucket_step=16,
    sample_step=16,
    methods=(TrainingMethod.LORA, TrainingMethod.FINE_TUNE, TrainingMethod.EMBEDDING),
    output_formats={
        TrainingMethod.LORA: (ModelFormat.DIFFUSERS_LORA, ModelFormat.KOHYA_LORA, ModelFormat.COMFY_LORA),
        TrainingMethod.FINE_TUNE: (ModelFormat.DIFFUSERS, ModelFormat.ORIGINAL_TRANSFORMER),
        TrainingMethod.EMBEDDING: (ModelFormat.SAFETENSORS,),
    },
    # the DiT's blocks, Qwen3's decoder layers
    muon_hidden_layers=("transformer_blocks", "language_model.layers"),
    # OneTrainer's Anima presets (BaseAnimaSetup.LAYER_PRESETS), matched as substrings of the module paths
    layer_presets={
        "attn-mlp": ("attn1", "attn2", "ff"),
        "attn-only": ("attn1", "attn2"),
        "blocks": ("transformer_block",),
        "full": (),
    },
    hub_parts=("transformer", "text_encoder", "vae"),
    capabilities=frozenset({FLOW_MATCHING}),
    part_capabilities={
        "transformer": frozenset({OWN_MODEL, LAYER_OFFLOADING}),
        "text_encoder": frozenset({LAYER_OFFLOADING}),
    },
    # OneTrainer runs Qwen3 outside float16 autocast (BaseAnimaSetup)
    float16_unsafe_parts=("text_encoder",),
    file_caveats=(
        text_encoder_caveat(
            "text_encoder",
            "diffusers' AnimaModularPipeline.load_lora_weights reads the transformer's (and the LLM adapter's) part of "
            "a DIFFUSERS_LORA file, not the Qwen3 LoRA",
        ),
    ),
    notes="Anima (circlestone-labs) is NVIDIA's Cosmos-Predict2-2B DiT fine-tuned on Qwen3-0.6B's text through an "
    "LLM adapter: as AnimaModularPipeline encodes a caption, Qwen3 reads it as plain text (no template) and its last "
    "hidden states, padding zeroed, go into the adapter (diffusers' `text_conditioner`), whose queries are learned "
    "embeddings of the caption's T5 token ids; its output, padded with zeros to 512 tokens, is the transformer's "
    "text. `text_encoder` is Qwen3 and the adapter together (they move, train and cache as one; OneTrainer trains "
    "neither). The VAE is Qwen-Image's (Wan's) on single frames, latents normalised per channel; training is "
    "rectified flow (the transformer takes sigma and predicts the flow). Samples run AnimaModularPipeline with "
    "classifier-free guidance. LoRA files: DIFFUSERS_LORA (the pipeline's `load_lora_weights`), KOHYA_LORA "
    "(`lora_unet_` + the original DiT's module names, as OneTrainer writes them) or COMFY_LORA (`diffusion_model.` + "
    "the original DiT's module paths, ComfyUI's names, which diffusers' Anima loader converts too but without an "
    "`alpha`: train with alpha = rank for it); LoHa and LoKr too. Fine-tunes: a diffusers folder "
    "(also the backup, usable as a base model) or the original single file (ORIGINAL_TRANSFORMER: the DiT under "
    "`net.` in NVIDIA's names with the adapter under `net.llm_adapter.`, as Anima was released), which "
    "`transformer.model_name` reads back over a diffusers base.",
)
_ANIMA_SAMPLE = SampleDefaults(1024, 1024, 30, 4.0, NoiseScheduler.EULER)

# The model types this module declares, in the order the model-type menu lists them.
MODEL_TYPES: tuple[ModelTypeInfo, ...] = (
    ModelTypeInfo(
        ModelType.ANIMA,
        "Anima",
        ANIMA,
        1024,
        False,
        False,
        _ANIMA_SAMPLE,
        released_parts={
            "transformer": ref.ANIMA_TRANSFORMER,
            # Qwen3 and the LLM adapter, the part's own class built from their configs
            "text_encoder": {
                "_module": "onetrainer.families.anima",
                "_class_name": "AnimaTextEncoder",
                "language_model": ref.QWEN3_06B_TEXT,
                "conditioner": ref.ANIMA_TEXT_CONDITIONER,
            },
            "vae": ref.QWEN_IMAGE_VAE,
        },
    ),
)
