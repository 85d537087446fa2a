"""Sana: a linear-attention DiT on Gemma-2, over the 32x deep-compression autoencoder's latents.

The declaration of `sana.py`'s family (torch-free: the config and the GUI read it through `config/model_types.py`):
its model type, parts, formats, capabilities, layer presets, notes and sample defaults.
"""

from __future__ import annotations

from onetrainer.config.enums import ModelFormat, ModelType, NoiseScheduler, TrainingMethod
from onetrainer.config.family_info import (
    FLOW_MATCHING,
    LAYER_OFFLOADING,
    LAYER_SKIP,
    FamilyInfo,
    ModelTypeInfo,
    PartRole,
    SampleDefaults,
)
from onetrainer.families import reference_configs as ref
from onetrainer.families.lora_caveats import text_encoder_caveat

SANA = FamilyInfo(
    key="sana",
    label="Sana",
    part_roles={"transformer": PartRole.DENOISER, "text_encoder": PartRole.TEXT_ENCODER, "vae": PartRole.IMAGE_ENCODER},
    # the autoencoder downsamples 32x and the transformer takes 1x1 patches: a latent pixel is 32 px
    bucket_step=32,
    sample_step=32,
    methods=(TrainingMethod.LORA, TrainingMethod.FINE_TUNE, TrainingMethod.EMBEDDING),
    output_formats={
        TrainingMethod.LORA: (ModelFormat.DIFFUSERS_LORA, ModelFormat.KOHYA_LORA),
        TrainingMethod.FINE_TUNE: (ModelFormat.DIFFUSERS,),
        TrainingMethod.EMBEDDING: (ModelFormat.SAFETENSORS,),
    },
    # OneTrainer's Sana presets (BaseSanaSetup.LAYER_PRESETS), matched as substrings of the module paths
    muon_hidden_layers=("transformer_blocks", "layers"),  # the DiT blocks, Gemma-2's layers
    layer_presets={
        "attn-mlp": ("attn1", "attn2", "ff."),
        "attn-only": ("attn1", "attn2"),
        "blocks": ("transformer_block",),
        "full": (),
    },
    hub_parts=("transformer", "text_encoder", "vae"),
    capabilities=frozenset({LAYER_SKIP, FLOW_MATCHING}),
    part_capabilities={
        "transformer": frozenset({LAYER_OFFLOADING}),
        "text_encoder": frozenset({LAYER_OFFLOADING}),
    },
    # OneTrainer runs Gemma-2 and the autoencoder outside float16 autocast (BaseSanaSetup)
    float16_unsafe_parts=("text_encoder", "vae"),
    file_caveats=(
        text_encoder_caveat(
            "text_encoder",
            "diffusers' SanaPipeline.load_lora_weights reads the transformer's part of a DIFFUSERS_LORA file, not the "
            "Gemma-2 LoRA",
        ),
    ),
    notes="`text_encoder` is Gemma-2 (2B): as SanaPipeline prompts it, each caption is lowercased and put after "
    "Sana's complex human instruction (the text asking for an enhanced description), and the start token with the "
    "last 299 of those tokens (the caption's and its padding, 300 in all) condition the transformer, with their "
    "mask (OneTrainer encodes the caption alone, 300 tokens: the conditioning here is the one the pipeline samples "
    "the released model with). Clip skip takes an earlier layer through Gemma's final norm. Caption dropout zeroes "
    "the conditioning and its mask, as OneTrainer does. The latents are the DC-AE's (32x down, 32 channels) times its "
    "scaling factor; training is rectified flow at the `timestep_shift` you set (Sana's sampler shifts by its own "
    "`flow_shift`, 3 at 1024 px). Samples run SanaPipeline with the model's own DPM-Solver sampler and "
    "classifier-free guidance with the negative prompt. LoRA files: DIFFUSERS_LORA (SanaPipeline's "
    "`load_lora_weights`) or KOHYA_LORA (OneTrainer's names, `lora_unet_` / `lora_te_` + the diffusers module path; "
    "LoHa and LoKr too, which diffusers does not load); ComfyUI has no Sana model. Fine-tunes: a diffusers folder "
    "(also the backup, usable as a base model). One model type covers Sana 600M and 1600M and SANA 1.5 (the estimate "
    "counts the one the base model's name says); Sana Sprint (guidance-distilled, SCM sampling) is refused.",
)
_SANA_SAMPLE = SampleDefaults(1024, 1024, 20, 4.5, NoiseScheduler.DPMPP)

# The model types this module declares, in the order the model-type menu lists them.
MODEL_TYPES: tuple[ModelTypeInfo, ...] = (
    ModelTypeInfo(
        ModelType.SANA,
        "Sana",
        SANA,
        1024,
        False,
        False,
        _SANA_SAMPLE,
        released_parts={
            "transformer": ref.SANA_1600M_TRANSFORMER,
            "text_encoder": ref.GEMMA2_2B_TEXT,
            "vae": ref.SANA_DC_AE,
        },
        released_variants=(
            ("sana_600m", {"transformer": ref.SANA_600M_TRANSFORMER}),
            ("4.8b", {"transformer": ref.SANA15_4800M_TRANSFORMER}),
        ),
    ),
)
