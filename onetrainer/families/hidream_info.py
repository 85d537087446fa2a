"""HiDream-I1: a sparse (mixture-of-experts) diffusion transformer over 2x2 patches of the Flux VAE's latents,
conditioned on four text encoders.

The declaration of `hidream.py`'s family (torch-free: the config and the GUI read it through `config/model_types.py`):
its model type, parts, formats, capabilities, layer presets, notes and sample defaults.
"""

from __future__ import annotations

from onetrainer.config.enums import ModelFormat, ModelType, NoiseScheduler, TrainingMethod
from onetrainer.config.family_info import (
    FLOW_MATCHING,
    LAYER_OFFLOADING,
    OWN_MODEL,
    SEQUENCE_LENGTH,
    TEXT_PADDING_MASK,
    FamilyInfo,
    ModelTypeInfo,
    PartRole,
    SampleDefaults,
)
from onetrainer.families import reference_configs as ref
from onetrainer.families.lora_caveats import text_encoder_caveat

_DIFFUSERS_READS = "diffusers' HiDreamImagePipeline.load_lora_weights reads the transformer's part of a DIFFUSERS_LORA"

HIDREAM = FamilyInfo(
    key="hidream",
    label="HiDream-I1",
    part_roles={
        "transformer": PartRole.DENOISER,
        "text_encoder": PartRole.TEXT_ENCODER,
        "text_encoder_2": PartRole.TEXT_ENCODER,
        "text_encoder_3": PartRole.TEXT_ENCODER,
        "text_encoder_4": PartRole.TEXT_ENCODER,
        "vae": PartRole.IMAGE_ENCODER,
    },
    # the VAE downsamples 8x and the transformer takes 2x2 patches: a token is 16 px
    bucket_step=16,
    sample_step=16,
    methods=(TrainingMethod.LORA, TrainingMethod.FINE_TUNE, TrainingMethod.EMBEDDING),
    output_formats={
        TrainingMethod.LORA: (ModelFormat.DIFFUSERS_LORA, ModelFormat.KOHYA_LORA, ModelFormat.COMFY_LORA),
        TrainingMethod.FINE_TUNE: (ModelFormat.DIFFUSERS, ModelFormat.ORIGINAL_TRANSFORMER),
        TrainingMethod.EMBEDDING: (ModelFormat.SAFETENSORS,),
    },
    # OneTrainer's HiDream presets (BaseHiDreamSetup.LAYER_PRESETS), matched as substrings of the module paths
    layer_presets={
        "attn-mlp": ("attn1", "ff_i"),
        "attn-only": ("attn1",),
        "blocks": ("stream_block",),
        "full": (),
    },
    # the transformer's blocks, T5's blocks, the CLIPs' and Llama's layers
    muon_hidden_layers=("stream_blocks", "encoder.block", "encoder.layers", "model.layers"),
    hub_parts=("transformer", "text_encoder", "text_encoder_2", "text_encoder_3", "vae"),
    capabilities=frozenset({FLOW_MATCHING, TEXT_PADDING_MASK}),
    part_capabilities={
        "transformer": frozenset({OWN_MODEL, LAYER_OFFLOADING}),
        "text_encoder_3": frozenset({SEQUENCE_LENGTH, LAYER_OFFLOADING}),
        "text_encoder_4": frozenset({OWN_MODEL, SEQUENCE_LENGTH, LAYER_OFFLOADING}),
    },
    # OneTrainer runs the transformer and T5 outside float16 autocast (BaseHiDreamSetup)
    float16_unsafe_parts=("transformer", "text_encoder_3"),
    file_caveats=tuple(
        text_encoder_caveat(part, f"{_DIFFUSERS_READS} file, not the {name} LoRA")
        for part, name in (
            ("text_encoder", "CLIP-L"),
            ("text_encoder_2", "CLIP-G"),
            ("text_encoder_3", "T5"),
            ("text_encoder_4", "Llama"),
        )
    ),
    notes="`text_encoder` and `text_encoder_2` are Long-CLIP-L and -G (their projected pooled outputs, joined, "
    "condition the time embedding), `text_encoder_3` T5-XXL (its hidden states), `text_encoder_4` "
    "Llama-3.1-8B-Instruct, which HiDream-ai's folders do not hold: `text_encoder_4.model_name` names it "
    "(meta-llama/Llama-3.1-8B-Instruct, as OneTrainer's preset; empty: the base's `text_encoder_4`/`tokenizer_4`). "
    "Each transformer block reads one of Llama's layers (the transformer config's `llama_layers`), so the text "
    "cache keeps all 32 of Llama's hidden states: 64 MiB a caption at 128 tokens (float32), a shorter "
    "`text_encoder_4_sequence_length` less. As HiDreamImagePipeline.encode_prompt: every encoder reads the "
    "caption padded to 128 tokens (`text_encoder_3_sequence_length` / `text_encoder_4_sequence_length` change T5's "
    "and Llama's; the CLIPs take at most 218), T5 and Llama attend only to the caption's tokens, Llama is padded "
    "with its end token; `transformer.attention_mask` zeroes T5's and Llama's states of the padding (OneTrainer's "
    "Force attention mask), which the transformer otherwise attends to. Caption dropout zeroes each encoder's "
    "share on its own draw, as OneTrainer does. The "
    "transformer is a mixture of experts: it routes each token to 2 of 4 experts; the routing's balancing loss, "
    "which the model computes in training, is dropped by the model itself, and OneTrainer adds none, nor does this "
    "trainer. Latents are the Flux VAE's, shifted and scaled; training is rectified flow (the transformer predicts "
    "x0 − ε, the negated flow, and gets σ·1000). Samples run HiDreamImagePipeline at the sample's size (the "
    "pipeline would scale any size to 1024² px) with CFG and the negative prompt, on the flow-matching Euler "
    "sampler at the model's shift (HiDream-I1-Full's folder names a UniPC sampler with `flow_shift` 3). LoRA "
    "files: DIFFUSERS_LORA (peft names under `transformer.` and `text_encoder`…`text_encoder_4.`; diffusers loads "
    "the transformer's), KOHYA_LORA (`lora_unet_` / `lora_te1_`…`lora_te4_` + the module paths) or COMFY_LORA "
    "(ComfyUI's `diffusion_model.` + the transformer's module paths; the text encoders under "
    "`text_encoders.clip_l/clip_g/t5xxl/llama.transformer.`, as OneTrainer names them). Fine-tunes: the "
    "diffusers folder (also the backup, usable as a base model), Llama included, or ORIGINAL_TRANSFORMER: the "
    "transformer alone in one file under the names HiDream-ai's code, ComfyUI and diffusers share (as OneTrainer "
    "writes it), which `transformer.model_name` reads back over a diffusers base.",
)
_HIDREAM_SAMPLE = SampleDefaults(1024, 1024, 50, 5.0, NoiseScheduler.EULER)

# The model types this module declares, in the order the model-type menu lists them.
MODEL_TYPES: tuple[ModelTypeInfo, ...] = (
    ModelTypeInfo(
        ModelType.HI_DREAM_FULL,
        "HiDream-I1 Full",
        HIDREAM,
        1024,
        False,
        False,
        _HIDREAM_SAMPLE,
        released_parts={
            "transformer": ref.HIDREAM_I1_TRANSFORMER,
            "text_encoder": ref.LONG_CLIP_L_PROJECTED_TEXT,
            "text_encoder_2": ref.LONG_CLIP_G_PROJECTED_TEXT,
            "text_encoder_3": ref.T5_XXL_ENCODER,
            "text_encoder_4": ref.LLAMA31_8B_TEXT,
            "vae": ref.FLUX_VAE,
        },
    ),
)
