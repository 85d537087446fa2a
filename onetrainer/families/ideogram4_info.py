"""Ideogram 4: a single-stream DiT over one packed sequence of text and 2x2-patched latents of Flux.2's VAE,
conditioned on 13 of Qwen3-VL-8B's layers side by side, with a second, unconditional transformer of the same shape
that only sampling runs (asymmetric classifier-free guidance).

The declaration of `ideogram4.py`'s family (torch-free: the config and the GUI read it through `config/model_types.py`):
its model type, parts, formats, capabilities, layer presets, notes, sample defaults and the released model's full-size
configs (only the VAE, Flux.2's, is shared in `reference_configs`).
"""

from __future__ import annotations

from typing import Any

from onetrainer.config.enums import ModelFormat, ModelType, NoiseScheduler, TrainingMethod
from onetrainer.config.family_info import (
    FLOW_MATCHING,
    LAYER_OFFLOADING,
    OPTIONAL_PART,
    OWN_MODEL,
    FamilyInfo,
    ModelTypeInfo,
    PartRole,
    SampleDefaults,
)
from onetrainer.families import reference_configs as ref
from onetrainer.families.lora_caveats import text_encoder_caveat

Config = dict[str, Any]

# --- the released model's configs (its diffusers folder's config.json files) -------------------------------------

# Ideogram 4's transformer and unconditional_transformer (the same class and shape; diffusers'
# Ideogram4Transformer2DModel defaults): 34 blocks of 18 heads of 256 (4608 wide), a SwiGLU MLP 12288 wide, a 512-wide
# AdaLN conditioning, 2x2 patches of the VAE's 32 channels in (128), the text as 13 of Qwen3-VL-8B's 4096-wide layers
# side by side (53248), interleaved multimodal rotary sections 24/20/20 over (t, row, column).
IDEOGRAM4_TRANSFORMER: Config = {
    "_class_name": "Ideogram4Transformer2DModel",
    "in_channels": 128,
    "num_layers": 34,
    "attention_head_dim": 256,
    "num_attention_heads": 18,
    "intermediate_size": 12288,
    "adaln_dim": 512,
    "llm_features_dim": 53248,
    "rope_theta": 5000000,
    "mrope_section": [24, 20, 20],
    "norm_eps": 1e-05,
}

# Qwen3-VL-8B-Instruct (Qwen/Qwen3-VL-8B-Instruct config.json) as Ideogram 4's text_encoder, loaded as the bare
# Qwen3VLModel (the pipeline's class; it runs the language model's decoder layers itself): 36 layers, 32 query heads and
# 8 key/value heads of 128 over 4096 channels, interleaved multimodal rotary sections 24/20/20; its vision tower of 27
# blocks (never run for text), blocks 8, 16 and 24 feeding the decoder (deepstack). Transformers 5 keeps `rope_theta` /
# `rope_scaling` in `rope_parameters`.
QWEN3_VL_8B_TEXT: Config = {
    "architectures": ["Qwen3VLModel"],
    "model_type": "qwen3_vl",
    "image_token_id": 151655,
    "video_token_id": 151656,
    "vision_start_token_id": 151652,
    "vision_end_token_id": 151653,
    "tie_word_embeddings": False,
    "text_config": {
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "head_dim": 128,
        "hidden_act": "silu",
        "hidden_size": 4096,
        "initializer_range": 0.02,
        "intermediate_size": 12288,
        "max_position_embeddings": 262144,
        "num_attention_heads": 32,
        "num_hidden_layers": 36,
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-06,
        "rope_parameters": {
            "mrope_interleaved": True,
            "mrope_section": [24, 20, 20],
            "rope_type": "default",
            "rope_theta": 5000000,
        },
        "tie_word_embeddings": False,
        "use_cache": True,
        "vocab_size": 151936,
    },
    "vision_config": {
        "deepstack_visual_indexes": [8, 16, 24],
        "depth": 27,
        "hidden_act": "gelu_pytorch_tanh",
        "hidden_size": 1152,
        "in_channels": 3,
        "initializer_range": 0.02,
        "intermediate_size": 4304,
        "num_heads": 16,
        "num_position_embeddings": 2304,
        "out_hidden_size": 4096,
        "patch_size": 16,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
    },
}

# Ideogram 4's scheduler/ (FlowMatchEulerDiscreteScheduler). The pipeline sets its own sigmas (a logit-normal schedule
# shifted by the resolution); the hub file could not be read offline: diffusers' defaults (T = 1000, no shift) are
# assumed here (the tiny model's scheduler), a loaded model's own file counts.
IDEOGRAM4_SCHEDULER: Config = {
    "_class_name": "FlowMatchEulerDiscreteScheduler",
    "num_train_timesteps": 1000,
    "shift": 1.0,
    "use_dynamic_shifting": False,
}

# --- the family -----------------------------------------------------------------------------------------------------

# OneTrainer's Ideogram presets (BaseIdeogramSetup.LAYER_PRESETS), matched as substrings of the transformer's paths.
_IDEOGRAM4_LAYER_PRESETS = {
    "attn-mlp": ("attention", "feed_forward"),
    "attn-only": ("attention",),
    "blocks": ("layers",),
    "full": (),
}

IDEOGRAM4 = FamilyInfo(
    key="ideogram4",
    label="Ideogram 4",
    part_roles={
        "transformer": PartRole.DENOISER,
        "text_encoder": PartRole.TEXT_ENCODER,
        "unconditional_transformer": PartRole.SAMPLING,
        "vae": PartRole.IMAGE_ENCODER,
    },
    # the VAE downsamples 8x and the latents are patched 2x2: a token is 16 px (the pipeline's divisor)
    bucket_step=16,
    sample_step=16,
    methods=(TrainingMethod.LORA, TrainingMethod.FINE_TUNE, TrainingMethod.EMBEDDING),
    output_formats={
        TrainingMethod.LORA: (ModelFormat.DIFFUSERS_LORA, ModelFormat.KOHYA_LORA, ModelFormat.COMFY_LORA),
        TrainingMethod.FINE_TUNE: (ModelFormat.DIFFUSERS, ModelFormat.ORIGINAL_TRANSFORMER),
        TrainingMethod.EMBEDDING: (ModelFormat.SAFETENSORS,),
    },
    muon_hidden_layers=("layers",),  # the DiT's blocks, Qwen3-VL's decoder layers (language_model.layers)
    layer_presets=_IDEOGRAM4_LAYER_PRESETS,
    hub_parts=("transformer", "text_encoder", "unconditional_transformer", "vae"),
    capabilities=frozenset({FLOW_MATCHING}),
    part_capabilities={
        "transformer": frozenset({OWN_MODEL, LAYER_OFFLOADING}),
        "text_encoder": frozenset({LAYER_OFFLOADING}),
        # OneTrainer's `include_unconditional_transformer`: left out, samples guide against the empty caption
        "unconditional_transformer": frozenset({OPTIONAL_PART}),
    },
    # OneTrainer runs Qwen3-VL outside float16 autocast (BaseIdeogramSetup)
    float16_unsafe_parts=("text_encoder",),
    file_caveats=(
        text_encoder_caveat(
            "text_encoder",
            "diffusers' Ideogram4Pipeline.load_lora_weights reads the transformer's part of a DIFFUSERS_LORA file, "
            "not the Qwen3-VL LoRA",
        ),
    ),
    notes="`text_encoder` is Qwen3-VL-8B (its language model reads the captions): as Ideogram4Pipeline prompts it, "
    "each caption is one user message of its chat template with the assistant's opening, and the outputs of 13 of "
    "its 36 decoder layers (0, 3, … 33 and 35) side by side condition the transformer, the padding zeroed; the text "
    "cache keeps each caption's tokens. Caption dropout encodes the empty caption. The latents are the mode of "
    "Flux.2's VAE (32 channels at 1/8 size), patched 2x2 into tokens and normalised there by the VAE's batch-norm "
    "statistics as the pipeline decodes them: training and sample sizes go in steps of 16 px. The transformer takes "
    "one packed sequence, [text][image] (OneTrainer's and the pipeline's layout: each caption's tokens end where the "
    "image begins), the time 1 − σ, and predicts x0 − ε. Training is rectified flow at the `timestep_shift` you set, "
    "or with `dynamic_timestep_shifting` the pipeline's resolution shift (√(pixels)/512, as OneTrainer). Only "
    "`transformer` trains: `unconditional_transformer`, a second transformer of the same shape, runs in samples "
    "alone as the guidance's negative branch (the image tokens without text), blended as uncond + CFG·(cond − "
    "uncond); the negative prompt is not used. `unconditional_transformer.include` off leaves it out (never "
    "loaded, as OneTrainer's option): samples then guide against the empty caption through the trained "
    "transformer, and a fine-tune is written as ORIGINAL_TRANSFORMER (a DIFFUSERS folder holds both). Samples run "
    "Ideogram4Pipeline (its logit-normal schedule shifted by "
    "the resolution, the sample's CFG scale constant over the steps). LoRA files: DIFFUSERS_LORA "
    "(Ideogram4Pipeline's `load_lora_weights`), KOHYA_LORA (OneTrainer's kohya layout over the original names: "
    "`lora_unet_` + the path, q/k/v as one exact LoRA on `attention.qkv`, `to_out.0` as `attention.o`; Qwen3-VL "
    "under `lora_te1_`) or COMFY_LORA (the same under `diffusion_model.` with the dotted path, which "
    "`load_lora_weights` converts too; a layer filter beyond the blocks, OneTrainer's `full`, writes modules it "
    "refuses). LoHa and LoKr keep q/k/v apart under diffusers' paths (`lora_transformer_`). Fine-tunes: a "
    "diffusers folder (also the backup, usable as a base model) or the transformer "
    "alone in the original layout (ORIGINAL_TRANSFORMER, as OneTrainer writes it: fused `attention.qkv`, "
    "`attention.o`), which `transformer.model_name` reads back over a diffusers base (diffusers' names too). "
    "OneTrainer offers no embeddings for Ideogram 4; here they train Qwen3-VL's token table.",
)
# OneTrainer's sample defaults for Ideogram 4 (25 steps at CFG 3, 1024 px: lowered from the pipeline's 48 steps at 7)
_IDEOGRAM4_SAMPLE = SampleDefaults(1024, 1024, 25, 3.0, NoiseScheduler.EULER)

# The model types this module declares, in the order the model-type menu lists them.
MODEL_TYPES: tuple[ModelTypeInfo, ...] = (
    ModelTypeInfo(
        ModelType.IDEOGRAM_4,
        "Ideogram 4",
        IDEOGRAM4,
        1024,
        False,
        False,
        _IDEOGRAM4_SAMPLE,
        released_parts={
            "transformer": IDEOGRAM4_TRANSFORMER,
            "text_encoder": QWEN3_VL_8B_TEXT,
            "unconditional_transformer": IDEOGRAM4_TRANSFORMER,
            "vae": ref.FLUX2_VAE,
        },
    ),
)
