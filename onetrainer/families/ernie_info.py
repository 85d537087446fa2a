"""ERNIE-Image (Baidu's ERNIE-Image and ERNIE-Image-Turbo): a single-stream DiT with one shared AdaLN modulation over
2x2-patchified latents of Flux.2's VAE, conditioned on Ministral 3 3B's second-to-last hidden states.

The declaration of `ernie.py`'s family (torch-free: the config and the GUI read it through `config/model_types.py`):
its model type, parts, formats, capabilities, layer presets, notes, sample defaults and the released model's full-size
configs (declared here: only the VAE, Flux.2's, and the Pixtral vision tower are shared in `reference_configs`).
"""

from __future__ import annotations

from typing import Any

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

Config = dict[str, Any]

# --- the released model's configs (its diffusers folder's config.json files) -------------------------------------

# ERNIE-Image's transformer (baidu/ERNIE-Image and -Turbo transformer/, the 8B DiT): 36 shared-AdaLN blocks of 32 heads
# of 128 (4096 wide), a gated-GELU MLP 12288 wide, 1x1 patches of the 128-channel patchified latents, the text
# projected from Ministral 3B's 3072 channels, 3 rotary axes (text position / image's text offset, row, column)
# splitting each head's 128 as 32 + 48 + 48 (ComfyUI's `comfy/ldm/ernie` and sglang's ErnieImage config give these
# sizes).
ERNIE_IMAGE_TRANSFORMER: Config = {
    "_class_name": "ErnieImageTransformer2DModel",
    "eps": 1e-06,
    "ffn_hidden_size": 12288,
    "hidden_size": 4096,
    "in_channels": 128,
    "num_attention_heads": 32,
    "num_layers": 36,
    "out_channels": 128,
    "patch_size": 1,
    "qk_layernorm": True,
    "rope_axes_dim": [32, 48, 48],
    "rope_theta": 256,
    "text_in_dim": 3072,
}

# Ministral 3 3B as ERNIE-Image's text_encoder/ (`Mistral3Model`, as ErnieImagePipeline and OneTrainer load it: the
# Ministral3 language model 3072 wide with 26 layers, a Pixtral vision tower and its projector, no LM head; the
# pipeline reads the text's second-to-last hidden states).
MINISTRAL3_3B: Config = {
    "architectures": ["Mistral3Model"],
    "model_type": "mistral3",
    "image_token_index": 10,
    "multimodal_projector_bias": False,
    "projector_hidden_act": "gelu",
    "spatial_merge_size": 2,
    "tie_word_embeddings": True,
    "vision_feature_layer": -1,
    "text_config": {
        "model_type": "ministral3",
        "attention_dropout": 0.0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 11,
        "head_dim": 128,
        "hidden_act": "silu",
        "hidden_size": 3072,
        "initializer_range": 0.02,
        "intermediate_size": 9216,
        "max_position_embeddings": 262144,
        "num_attention_heads": 32,
        "num_hidden_layers": 26,
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-05,
        "rope_parameters": {
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "factor": 16.0,
            "llama_4_scaling_beta": 0.1,
            "max_position_embeddings": 262144,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
            "original_max_position_embeddings": 16384,
            "rope_theta": 1000000.0,
            "rope_type": "yarn",
        },
        "sliding_window": None,
        "tie_word_embeddings": True,
        "vocab_size": 131072,
    },
    "vision_config": {**ref.PIXTRAL_VISION},
}

# ERNIE-Image's scheduler/ (FlowMatchEulerDiscreteScheduler). The pipeline sets its sigmas itself (linspace(1, 0) over
# the steps) and the scheduler shifts them by its `shift`; the hub file's value could not be read offline: 3.0 with no
# dynamic shifting is assumed here (the tiny model's scheduler), a loaded model's own file counts.
ERNIE_IMAGE_SCHEDULER: Config = {
    "_class_name": "FlowMatchEulerDiscreteScheduler",
    "base_image_seq_len": 256,
    "base_shift": 0.5,
    "max_image_seq_len": 4096,
    "max_shift": 1.15,
    "num_train_timesteps": 1000,
    "shift": 3.0,
    "use_dynamic_shifting": False,
}

# --- the family -----------------------------------------------------------------------------------------------------

# OneTrainer's ERNIE presets (BaseErnieSetup.LAYER_PRESETS), matched as substrings of the transformer's module paths.
_ERNIE_LAYER_PRESETS = {
    "attn-mlp": ("self_attention", "mlp"),
    "attn-only": ("self_attention",),
    "blocks": ("layers",),
    "full": (),
}

ERNIE = FamilyInfo(
    key="ernie",
    label="ERNIE-Image",
    part_roles={"transformer": PartRole.DENOISER, "text_encoder": PartRole.TEXT_ENCODER, "vae": PartRole.IMAGE_ENCODER},
    # the VAE downsamples 8x and the latents are patchified 2x2: a token is 16 px (the pipeline's vae_scale_factor)
    bucket_step=16,
    sample_step=16,
    methods=(TrainingMethod.LORA, TrainingMethod.FINE_TUNE, TrainingMethod.EMBEDDING),
    output_formats={
        TrainingMethod.EMBEDDING: (ModelFormat.SAFETENSORS,),
        TrainingMethod.FINE_TUNE: (ModelFormat.DIFFUSERS, ModelFormat.ORIGINAL_TRANSFORMER),
        TrainingMethod.LORA: (ModelFormat.DIFFUSERS_LORA, ModelFormat.KOHYA_LORA, ModelFormat.COMFY_LORA),
    },
    muon_hidden_layers=("layers",),  # the DiT's blocks, Ministral's decoder layers (language_model.layers)
    layer_presets=_ERNIE_LAYER_PRESETS,
    hub_parts=("transformer", "text_encoder", "vae"),
    capabilities=frozenset({LAYER_SKIP, FLOW_MATCHING}),
    part_capabilities={
        "transformer": frozenset({OWN_MODEL, LAYER_OFFLOADING}),
        "text_encoder": frozenset({LAYER_OFFLOADING}),
    },
    # OneTrainer runs the text encoder outside float16 autocast (BaseErnieSetup)
    float16_unsafe_parts=("text_encoder",),
    file_caveats=(
        text_encoder_caveat(
            "text_encoder",
            "diffusers' ErnieImagePipeline.load_lora_weights reads the transformer's part of a DIFFUSERS_LORA file, "
            "not the Ministral LoRA",
        ),
    ),
    notes="`text_encoder` is Ministral 3 3B (Mistral3Model, its language model alone): each caption is tokenized "
    "with the start token, cut at 512 tokens (OneTrainer's length; the pipeline does not cut), and its second-to-last "
    "hidden states condition the transformer without the padding, as ErnieImagePipeline prompts it (clip skip "
    "counts further back). The pipeline's optional prompt enhancer (`pe`, a language model rewriting the prompt "
    "before it is encoded) is not loaded: training conditions on the caption as written and samples render the "
    "prompt as written (`use_pe` off), so a prompt means the same in both. Caption dropout encodes the empty "
    "caption (the start token alone, the pipeline's negative prompt). The latents are the mode of Flux.2's VAE (32 "
    "channels at 1/8 size) normalised by its batch-norm statistics over 2x2 patches with the variance epsilon the "
    "pipeline decodes with (1e-5; OneTrainer takes the config's 1e-4), patchified 2x2 for the transformer: training"
    " and sample sizes go in steps of 16 px. Training is rectified flow at the `timestep_shift` you set (or the "
    "resolution shift of `dynamic_timestep_shifting`, as OneTrainer); the transformer takes σ·1000. Samples run "
    "ErnieImagePipeline with our prompt embeddings and CFG against the negative prompt (a base model named Turbo: 8"
    " steps at CFG scale 1 by default). `transformer.model_name` may name a transformer file in diffusers' names "
    "(ComfyUI's `model.diffusion_model.` prefix too). LoRA files: DIFFUSERS_LORA (ErnieImagePipeline's "
    "`load_lora_weights`) or KOHYA_LORA (`lora_unet_` / `lora_te1_` + the module path, LoHa and LoKr too; ComfyUI "
    "reads the transformer's `lora_unet_` names, its ERNIE model having diffusers' module paths) or COMFY_LORA "
    "(`diffusion_model.` + the module path; Ministral's under ComfyUI's "
    "`text_encoders.ministral3_3b.transformer.model.`). Fine-tunes: a diffusers folder (also the backup, usable as "
    "a base model) or the transformer alone in diffusers' names (ORIGINAL_TRANSFORMER, as OneTrainer writes it). "
    "Embeddings train Ministral's token table (the file's key `ministral3_3b`, ComfyUI's name of the encoder); "
    "OneTrainer offers none for ERNIE.",
)
# the pipeline's defaults: 50 steps at CFG 4, 1024 px (ERNIE-Image-Turbo: 8 steps, CFG 1)
_ERNIE_SAMPLE = SampleDefaults(1024, 1024, 50, 4.0, NoiseScheduler.EULER)

# The model types this module declares, in the order the model-type menu lists them.
MODEL_TYPES: tuple[ModelTypeInfo, ...] = (
    ModelTypeInfo(
        ModelType.ERNIE,
        "ERNIE-Image (Turbo)",
        ERNIE,
        1024,
        False,
        False,
        _ERNIE_SAMPLE,
        released_parts={
            "transformer": ERNIE_IMAGE_TRANSFORMER,
            "text_encoder": MINISTRAL3_3B,
            "vae": ref.FLUX2_VAE,
        },
    ),
)
