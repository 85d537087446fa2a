"""Flux.2 ([klein] 4B and 9B, base and distilled; [dev]): a transformer of double- and single-stream blocks over
2x2-patchified 32-channel latents, conditioned on three layers of a language model's hidden states.

The declaration of `flux2.py`'s family (torch-free: the config and the GUI read it through `config/model_types.py`):
its model type, parts, formats, capabilities, layer presets, notes, sample defaults and the released models' full-size
configs (declared here, not among the shared `reference_configs`: a new family touches only its own files).
"""

from __future__ import annotations

from typing import Any

from onetrainer.config.enums import ModelFormat, ModelType, NoiseScheduler, TrainingMethod
from onetrainer.config.family_info import (
    FLOW_MATCHING,
    GUIDANCE_INPUT,
    LAYER_OFFLOADING,
    OWN_MODEL,
    REFERENCE_IMAGES,
    SEQUENCE_LENGTH,
    FamilyInfo,
    FileCaveat,
    ModelTypeInfo,
    PartRole,
    SampleDefaults,
)
from onetrainer.families import reference_configs as ref
from onetrainer.families.lora_caveats import text_encoder_caveat

Config = dict[str, Any]

# --- the released models' configs (their diffusers folders' config.json files) ------------------------------------

# FLUX.2 [dev] (black-forest-labs/FLUX.2-dev transformer/): 8 double- and 48 single-stream blocks of 48 heads of 128
# (6144 wide), 4 rotary axes of 32 (time, row, column, text position), the guidance embedding of a guidance-distilled
# model; the text is Mistral Small 3.x's layers 10, 20 and 30 side by side (3 x 5120).
FLUX2_DEV_TRANSFORMER: Config = {
    "_class_name": "Flux2Transformer2DModel",
    "attention_head_dim": 128,
    "axes_dims_rope": [32, 32, 32, 32],
    "eps": 1e-06,
    "guidance_embeds": True,
    "in_channels": 128,
    "joint_attention_dim": 15360,
    "mlp_ratio": 3.0,
    "num_attention_heads": 48,
    "num_layers": 8,
    "num_single_layers": 48,
    "out_channels": None,
    "patch_size": 1,
    "rope_theta": 2000,
    "timestep_guidance_channels": 256,
}
# FLUX.2 [klein] 4B (black-forest-labs/FLUX.2-klein-4B and -klein-base-4B; BFL's `Klein4BParams`): 5 + 20 blocks of 24
# heads (3072 wide), no guidance embedding; the text is Qwen3-4B's layers 9, 18 and 27 (3 x 2560).
FLUX2_KLEIN_4B_TRANSFORMER: Config = {
    **FLUX2_DEV_TRANSFORMER,
    "guidance_embeds": False,
    "joint_attention_dim": 7680,
    "num_attention_heads": 24,
    "num_layers": 5,
    "num_single_layers": 20,
}
# FLUX.2 [klein] 9B (-klein-9B and -klein-base-9B; `Klein9BParams`): 8 + 24 blocks of 32 heads (4096 wide); the text is
# Qwen3-8B's layers 9, 18 and 27 (3 x 4096).
FLUX2_KLEIN_9B_TRANSFORMER: Config = {
    **FLUX2_KLEIN_4B_TRANSFORMER,
    "joint_attention_dim": 12288,
    "num_attention_heads": 32,
    "num_layers": 8,
    "num_single_layers": 24,
}

# Flux.2's VAE (every Flux.2 model's vae/; ERNIE-Image's too): the shared reference config.
FLUX2_VAE: Config = ref.FLUX2_VAE

# Qwen3-4B (klein 4B's text_encoder/, as the hub's Qwen3ForCausalLM checkpoint: the decoder under `model.`, the LM head
# tied to the embedding). 36 layers; the pipeline reads the outputs of layers 9, 18 and 27.
QWEN3_4B_CAUSAL_LM: Config = {**ref.QWEN3_4B_TEXT, "architectures": ["Qwen3ForCausalLM"]}
# Qwen3-8B (klein 9B's text_encoder/): 4096 wide, its own LM head.
QWEN3_8B_CAUSAL_LM: Config = {
    **QWEN3_4B_CAUSAL_LM,
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "tie_word_embeddings": False,
}

# Mistral Small 3.2 24B as FLUX.2 [dev]'s text_encoder/ (Mistral3ForConditionalGeneration: a Pixtral vision tower, a
# patch merger and a 40-layer Mistral decoder 5120 wide; the pipeline reads the text layers 10, 20 and 30).
MISTRAL3_SMALL_24B: Config = {
    "architectures": ["Mistral3ForConditionalGeneration"],
    "model_type": "mistral3",
    "image_token_index": 10,
    "multimodal_projector_bias": False,
    "projector_hidden_act": "gelu",
    "spatial_merge_size": 2,
    "tie_word_embeddings": False,  # the language model's own LM head (transformers 5 reads the top-level setting)
    "vision_feature_layer": -1,
    "text_config": {
        "model_type": "mistral",
        "attention_dropout": 0.0,
        "head_dim": 128,
        "hidden_act": "silu",
        "hidden_size": 5120,
        "initializer_range": 0.02,
        "intermediate_size": 32768,
        "max_position_embeddings": 131072,
        "num_attention_heads": 32,
        "num_hidden_layers": 40,
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-05,
        "rope_theta": 1000000000.0,
        "sliding_window": None,
        "vocab_size": 131072,
    },
    "vision_config": {**ref.PIXTRAL_VISION},
}

# The system turn FLUX.2 [dev]'s pipeline puts before every prompt (BFL's `SYSTEM_MESSAGE`, diffusers'
# `pipelines/flux2/system_messages.py`).
DEV_SYSTEM_MESSAGE = (
    "You are an AI that reasons about image descriptions. You give structured responses focusing on object "
    "relationships, object\nattribution and actions without speculation."
)

# Every Flux.2 model's scheduler/ (FlowMatchEulerDiscreteScheduler): Flux.1's values. The pipelines pass their own μ
# (`compute_empirical_mu`, from the image's token count and the step count), so only `use_dynamic_shifting` and
# `num_train_timesteps` matter in samples; training's dynamic shift reads the linear rule's values (as OneTrainer).
FLUX2_SCHEDULER: Config = {
    "_class_name": "FlowMatchEulerDiscreteScheduler",
    "base_image_seq_len": 256,
    "base_shift": 0.5,
    "max_image_seq_len": 4096,
    "max_shift": 1.15,
    "num_train_timesteps": 1000,
    "shift": 3.0,
    "time_shift_type": "exponential",
    "use_dynamic_shifting": True,
}

# --- the family -----------------------------------------------------------------------------------------------------

# OneTrainer's Flux 2 presets: `blocks` (the numbered blocks: every `transformer_blocks.N.` and
# `single_transformer_blocks.N.` module, not the embedders, modulations and output layers) and `full`.
_FLUX2_LAYER_PRESETS = {"blocks": ("transformer_block",), "full": ()}
_FLUX2_REFERENCES_NOTE = (
    " Edits: an image's reference images (`<name>-reference.<ext>`, or `<name>-reference-1.<ext>`, `-2`, … in order; "
    "at most 10, an image with more is named and skipped) are the images the caption changes into the training image; "
    "an image without any trains text to image (a batch holds images with as many references each). As the pipelines "
    "feed them, each reference (the image's crop and flips applied) is shrunk to at most 1024x1024 px and "
    "centre-cropped to 16 px steps, its normalised latents packed as the image's and joined after the image's tokens "
    "with time position 10 + 10·i for reference i; the loss covers the image's tokens. Their latents are cached with "
    "the image; train with batch size 1 unless the references of a bucket have one size. A sample's "
    "`reference_images` (up to 10) go to the pipeline's `image`; none: a text-to-image sample."
)

FLUX2 = FamilyInfo(
    key="flux2",
    label="Flux.2",
    part_roles={"transformer": PartRole.DENOISER, "text_encoder": PartRole.TEXT_ENCODER, "vae": PartRole.IMAGE_ENCODER},
    bucket_step=16,
    sample_step=16,
    methods=(TrainingMethod.LORA, TrainingMethod.FINE_TUNE, TrainingMethod.EMBEDDING),
    output_formats={
        TrainingMethod.EMBEDDING: (ModelFormat.SAFETENSORS,),
        TrainingMethod.FINE_TUNE: (ModelFormat.DIFFUSERS, ModelFormat.ORIGINAL_TRANSFORMER),
        TrainingMethod.LORA: (ModelFormat.DIFFUSERS_LORA, ModelFormat.KOHYA_LORA),
    },
    muon_hidden_layers=("transformer_blocks", "model.layers"),  # Qwen3 or Mistral3 (language_model.layers)
    layer_presets=_FLUX2_LAYER_PRESETS,
    hub_parts=("transformer", "text_encoder", "vae"),
    # GUIDANCE_INPUT: [dev]'s `transformer.guidance_scale` (klein's transformer has no guidance input and ignores it).
    capabilities=frozenset({FLOW_MATCHING, GUIDANCE_INPUT, REFERENCE_IMAGES}),
    # Edits learn from reference images; an image without one trains text to image. Ten: the most references Black
    # Forest Labs' FLUX.2 announcement and model cards state the models take (the pipelines set no limit).
    reference_images=True,
    references_required=False,
    max_references=10,
    part_capabilities={
        "transformer": frozenset({OWN_MODEL, LAYER_OFFLOADING}),
        "text_encoder": frozenset({SEQUENCE_LENGTH, LAYER_OFFLOADING}),
    },
    file_caveats=(
        FileCaveat(
            ModelFormat.KOHYA_LORA,
            "the layer filter puts LoRA on the modulations, the guidance embedding or the output modulation "
            "(double_stream_modulation_img/txt, single_stream_modulation, guidance_in, final_layer.adaLN_modulation in "
            "BFL's names): ComfyUI reads them from a KOHYA_LORA file, diffusers' load_lora_weights drops them with a "
            "warning; OneTrainer's `blocks` filter leaves them out",
            modules=(
                "double_stream_modulation_img.linear",
                "double_stream_modulation_txt.linear",
                "single_stream_modulation.linear",
                "time_guidance_embed.guidance_embedder.linear_1",
                "time_guidance_embed.guidance_embedder.linear_2",
                "norm_out.linear",
            ),
        ),
        text_encoder_caveat(
            "text_encoder",
            "diffusers' Flux2Pipeline / Flux2KleinPipeline.load_lora_weights reads the transformer's part of a "
            "DIFFUSERS_LORA file only, not the text encoder's",
        ),
    ),
    notes="One model type covers [klein] 4B and 9B, base and distilled, and [dev]: the transformer's config and the "
    "text encoder tell which. [klein]'s `text_encoder` is Qwen3 (4B or 8B): each caption goes through its chat "
    "template as one user message (no thinking), padded to `text_encoder_sequence_length` tokens (512, the "
    "pipeline's), and the hidden states of layers 9, 18 and 27 "
    "side by side condition the transformer, padding included, as Flux2KleinPipeline prompts it. [dev]'s is Mistral "
    "Small 3.2 (Mistral3ForConditionalGeneration, its language model alone): each caption as a user message after "
    "FLUX.2's system message, padded to `text_encoder_sequence_length` tokens (the system message counted in them), "
    "layers 10, 20 and 30, as Flux2Pipeline prompts it; [dev] is "
    "guidance-distilled: training gives the transformer the fixed `transformer.guidance_scale`, samples the sample's "
    "guidance (its CFG scale, no negative pass). The VAE's 32-channel latents are normalised by its batch-norm "
    "statistics over 2x2 patches and packed 2x2 into the transformer's tokens: training and sample sizes go in steps "
    "of 16 px. Training draws the time as the other flow models do (`timestep_shift`, or the linear resolution "
    "shift of `dynamic_timestep_shifting` on the scheduler's values, as OneTrainer); samples use the pipeline's own "
    "empirical shift. Samples: base [klein] with "
    "CFG against the negative prompt, distilled [klein] (`is_distilled` in the folder's model_index.json) in 4 steps "
    "without. `transformer.model_name` may name a transformer file in Black Forest Labs' layout (ComfyUI's "
    "`model.diffusion_model.` prefix too) or diffusers' names to train instead of the base model's; "
    "ORIGINAL_TRANSFORMER writes BFL's layout (BFL's code, ComfyUI and diffusers' `from_single_file` read it). LoRA "
    "files: DIFFUSERS_LORA (the pipelines' `load_lora_weights` read the transformer's part) or KOHYA_LORA over BFL's "
    "names (`lora_unet_double_blocks_0_img_attn_qkv`: exact fused q/k/v), which ComfyUI and diffusers' kohya "
    "converter read (diffusers only the numbered blocks and the input and output layers)." + _FLUX2_REFERENCES_NOTE,
)

# diffusers' pipeline defaults: 50 steps at CFG 4 (klein base; dev's embedded guidance 4); distilled klein: 4 steps,
# no CFG (`flux2.Flux2Family.sample_defaults`).
_FLUX2_SAMPLE = SampleDefaults(1024, 1024, 50, 4.0, NoiseScheduler.EULER)

# The model types this module declares, in the order the model-type menu lists them.
MODEL_TYPES: tuple[ModelTypeInfo, ...] = (
    ModelTypeInfo(
        ModelType.FLUX_2,
        "Flux.2 (klein, dev)",
        FLUX2,
        1024,
        False,
        False,
        _FLUX2_SAMPLE,
        released_parts={
            "transformer": FLUX2_DEV_TRANSFORMER,
            "text_encoder": MISTRAL3_SMALL_24B,
            "vae": FLUX2_VAE,
        },
        released_variants=(
            ("klein-4b", {"transformer": FLUX2_KLEIN_4B_TRANSFORMER, "text_encoder": QWEN3_4B_CAUSAL_LM}),
            ("klein-base-4b", {"transformer": FLUX2_KLEIN_4B_TRANSFORMER, "text_encoder": QWEN3_4B_CAUSAL_LM}),
            ("klein-9b", {"transformer": FLUX2_KLEIN_9B_TRANSFORMER, "text_encoder": QWEN3_8B_CAUSAL_LM}),
            ("klein-base-9b", {"transformer": FLUX2_KLEIN_9B_TRANSFORMER, "text_encoder": QWEN3_8B_CAUSAL_LM}),
        ),
    ),
)
