"""Lumina-Image 2.0: a unified DiT on Gemma-2, over Flux's VAE latents.

The declaration of `lumina2.py`'s family (torch-free: the config and the GUI read it through `config/model_types.py`):
its model type, parts, formats, capabilities, layer presets, notes and sample defaults.
"""

from __future__ import annotations

from onetrainer.config.enums import ModelFormat, ModelType, NoiseScheduler, TrainingMethod
from onetrainer.config.family_info import (
    FLOW_MATCHING,
    LAYER_OFFLOADING,
    LAYER_SKIP,
    OWN_MODEL,
    FamilyInfo,
    ModelTypeInfo,
    PartRole,
    SampleDefaults,
)
from onetrainer.families import reference_configs as ref
from onetrainer.families.lora_caveats import text_encoder_caveat

LUMINA2 = FamilyInfo(
    key="lumina2",
    label="Lumina 2",
    part_roles={"transformer": PartRole.DENOISER, "text_encoder": PartRole.TEXT_ENCODER, "vae": PartRole.IMAGE_ENCODER},
    # the VAE downsamples 8x and the transformer takes 2x2 patches: a token is 16 px
    bucket_step=16,
    sample_step=16,
    methods=(TrainingMethod.LORA, TrainingMethod.FINE_TUNE, TrainingMethod.EMBEDDING),
    output_formats={
        TrainingMethod.LORA: (ModelFormat.DIFFUSERS_LORA, ModelFormat.COMFY_LORA, ModelFormat.KOHYA_LORA),
        TrainingMethod.FINE_TUNE: (ModelFormat.DIFFUSERS, ModelFormat.ORIGINAL_TRANSFORMER),
        TrainingMethod.EMBEDDING: (ModelFormat.SAFETENSORS,),
    },
    # OneTrainer has no Lumina 2: the layers as its Z-Image presets (the same architecture) name them, the refiners
    # included (their adapters load in diffusers and ComfyUI as the main blocks' do)
    muon_hidden_layers=("layers", "refiner"),  # the joint blocks and the refiners, Gemma-2's decoder layers
    layer_presets={
        "attn-mlp": ("attn", "feed_forward"),
        "attn-only": ("attn",),
        "blocks": ("layers.", "refiner."),
        "full": (),
    },
    hub_parts=("transformer", "text_encoder", "vae"),
    capabilities=frozenset({LAYER_SKIP, FLOW_MATCHING}),
    part_capabilities={
        "transformer": frozenset({OWN_MODEL, LAYER_OFFLOADING}),
        "text_encoder": frozenset({LAYER_OFFLOADING}),
    },
    # Gemma-2 overflows in float16 (as OneTrainer keeps Sana's Gemma-2 out of float16 autocast)
    float16_unsafe_parts=("text_encoder",),
    file_caveats=(
        text_encoder_caveat(
            "text_encoder",
            "diffusers' Lumina2Pipeline.load_lora_weights reads the transformer's part of a DIFFUSERS_LORA file, not "
            "the Gemma-2 LoRA",
        ),
    ),
    notes="OneTrainer does not train Lumina-Image 2.0; it is here because peers train it. `text_encoder` is Gemma-2 "
    "(2B): as Lumina2Pipeline prompts it, each caption goes after Lumina's system prompt (`<system prompt> <Prompt "
    "Start> <caption>`), 256 tokens padded on the right, and Gemma's second-to-last hidden states (clip skip counts "
    "further back) condition the transformer with their mask; the transformer reads each caption's own tokens, so "
    "the text cache keeps those. Caption dropout encodes the empty caption after the system prompt; the sample's "
    "negative prompt goes without it, as the pipeline's does. The latents are Flux's VAE's, shifted and scaled; "
    "training is rectified flow at the `timestep_shift` you set (the released sampler shifts by 6): the transformer "
    "takes 1 - sigma (0 is noise) and predicts the negative flow, as the pipeline reads it. Samples run "
    "Lumina2Pipeline with classifier-free guidance and its normalisation. LoRA files: DIFFUSERS_LORA (diffusers' "
    "`load_lora_weights`), COMFY_LORA (the released module names under `diffusion_model.`, q/k/v as one exact LoRA "
    "on the fused qkv, the scale folded in: what ComfyUI applies, and diffusers' `load_lora_weights` where every "
    "linear layer of each block is trained, the `blocks` preset; LoHa and LoKr keep q/k/v apart there, which only "
    "this trainer reads) or KOHYA_LORA (`lora_unet_` / `lora_te1_` + the diffusers module path; LoHa and LoKr too). "
    "Fine-tunes: a diffusers folder (also the backup, usable as a base model) or the transformer alone in the layout "
    "Alpha-VLLM released it in (ORIGINAL_TRANSFORMER: fused q/k/v, what ComfyUI's Load Diffusion Model and "
    "diffusers' `from_single_file` read), which `transformer.model_name` reads back over a diffusers base.",
)
_LUMINA2_SAMPLE = SampleDefaults(1024, 1024, 30, 4.0, NoiseScheduler.EULER)

# The model types this module declares, in the order the model-type menu lists them.
MODEL_TYPES: tuple[ModelTypeInfo, ...] = (
    ModelTypeInfo(
        ModelType.LUMINA_2,
        "Lumina 2",
        LUMINA2,
        1024,
        False,
        False,
        _LUMINA2_SAMPLE,
        released_parts={
            "transformer": ref.LUMINA2_TRANSFORMER,
            "text_encoder": ref.GEMMA2_2B_TEXT,
            "vae": ref.FLUX_VAE,
        },
    ),
)
