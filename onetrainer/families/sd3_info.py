"""Stable Diffusion 3 and 3.5: a joint (MMDiT) transformer over 2x2 patches of 16-channel latents, three text
encoders.

The declaration of `sd3.py`'s families (torch-free: the config and the GUI read it through
`config/model_types.py`): their model types, parts, formats, capabilities, layer presets, notes and sample defaults.
"""

from __future__ import annotations

from onetrainer.config.enums import ModelFormat, ModelType, NoiseScheduler, TrainingMethod
from onetrainer.config.family_info import (
    FLOW_MATCHING,
    LAYER_OFFLOADING,
    LAYER_SKIP,
    OPTIONAL_PART,
    SKIP_LAYER_GUIDANCE,
    FamilyInfo,
    ModelTypeInfo,
    PartRole,
    SampleDefaults,
)
from onetrainer.families import reference_configs as ref
from onetrainer.families.lora_caveats import text_encoder_caveat

SD3 = FamilyInfo(
    key="sd3",
    label="Stable Diffusion 3 / 3.5",
    part_roles={
        "transformer": PartRole.DENOISER,
        "text_encoder": PartRole.TEXT_ENCODER,
        "text_encoder_2": PartRole.TEXT_ENCODER,
        "text_encoder_3": PartRole.TEXT_ENCODER,
        "vae": PartRole.IMAGE_ENCODER,
    },
    bucket_step=16,
    sample_step=16,
    methods=(TrainingMethod.LORA, TrainingMethod.FINE_TUNE, TrainingMethod.EMBEDDING),
    output_formats={
        TrainingMethod.FINE_TUNE: (ModelFormat.DIFFUSERS, ModelFormat.ORIGINAL_SINGLE_FILE),
        TrainingMethod.LORA: (ModelFormat.DIFFUSERS_LORA, ModelFormat.KOHYA_LORA),
        TrainingMethod.EMBEDDING: (ModelFormat.SAFETENSORS,),
    },
    # OneTrainer's SD3 presets
    muon_hidden_layers=("transformer_blocks", "encoder.block", "encoder.layers"),  # T5 blocks, CLIP layers
    layer_presets={"attn-only": ("attn",), "blocks": ("transformer_block",), "full": ()},
    hub_parts=("transformer", "text_encoder", "text_encoder_2", "text_encoder_3", "vae"),
    capabilities=frozenset({LAYER_SKIP, FLOW_MATCHING, SKIP_LAYER_GUIDANCE}),
    part_capabilities={
        "transformer": frozenset({LAYER_OFFLOADING}),
        "text_encoder_3": frozenset({OPTIONAL_PART, LAYER_OFFLOADING}),
    },
    file_caveats=(
        text_encoder_caveat(
            "text_encoder_3",
            "diffusers' StableDiffusion3Pipeline.load_lora_weights reads the transformer and the two CLIP encoders "
            "of a DIFFUSERS_LORA file, not T5's LoRA",
        ),
    ),
    notes="Skip-layer guidance in samples: Stability AI recommends layers 7,8,9 for SD 3.5 Medium (better anatomy and "
    "structure). `text_encoder` is CLIP-L, `text_encoder_2` CLIP-G (both condition on their penultimate layer, "
    "clip skip counting from there, and on their projected pooled outputs), `text_encoder_3` T5-XXL (256 tokens, "
    "as diffusers' pipeline prompts it; `text_encoder_3.include` off leaves it out, never loaded, zeros in its "
    "place, as the pipeline without T5: 9.5 GB less, for smaller cards; load such a fine-tune's folder in "
    "diffusers with `text_encoder_3=None, tokenizer_3=None`). The CLIPs' hidden states are joined along the "
    "features, zero-padded to T5's width and joined with T5's along the sequence. The VAE's latents are shifted "
    "and scaled ((z - 0.0609) x 1.5305); training and sample sizes go in steps of 16 px. Samples render through "
    "diffusers' StableDiffusion3Pipeline with the model's flow-matching Euler sampler (shift 3), whichever sampler "
    "is chosen. The model type tells SD 3 from 3.5 by the transformer's config (3.5 normalises its queries and "
    "keys). Caption dropout zeroes each encoder's share on its own draw, as OneTrainer does. ORIGINAL_SINGLE_FILE "
    "writes one file in Stability AI's layout holding the transformer, the VAE and the three text encoders (as "
    "OneTrainer writes it), which ComfyUI's Load Checkpoint reads. Such a file (Stability AI's or ours) is also a "
    "base model: the transformer, and the VAE and text encoders it holds, come from it; the configs, the "
    "tokenizers and the parts it lacks from the variant's diffusers repository "
    "(stabilityai/stable-diffusion-3-medium-diffusers, stable-diffusion-3.5-medium or -3.5-large, told apart by "
    "the file's weights; gated on the hub: `hf auth login` once), as diffusers' from_single_file does, from the "
    "hub cache when offline. Embeddings hold a vector set for each included encoder (file keys clip_l, clip_g, t5, "
    "as OneTrainer writes them).",
)

# diffusers' pipeline defaults: SD 3 Medium 28 steps at CFG 7; the 3.5 model cards: 28 steps at 3.5 (Large)
_SD3_SAMPLE = SampleDefaults(1024, 1024, 28, 7.0, NoiseScheduler.EULER)
_SD35_SAMPLE = SampleDefaults(1024, 1024, 28, 3.5, NoiseScheduler.EULER)

# The released models' parts as their diffusers configs (what the estimate counts a hub model not yet downloaded as).
_SD3_ENCODERS = {
    "text_encoder": ref.CLIP_L_PROJECTED_TEXT,
    "text_encoder_2": ref.CLIP_G_PROJECTED_TEXT,
    "text_encoder_3": ref.T5_XXL_ENCODER,
    "vae": ref.SD3_VAE,
}

# The model types this module declares, in the order the model-type menu lists them.
MODEL_TYPES: tuple[ModelTypeInfo, ...] = (
    ModelTypeInfo(
        ModelType.STABLE_DIFFUSION_3,
        "SD 3",
        SD3,
        1024,
        False,
        False,
        _SD3_SAMPLE,
        released_parts={"transformer": ref.SD3_MEDIUM_TRANSFORMER, **_SD3_ENCODERS},
    ),
    ModelTypeInfo(
        ModelType.STABLE_DIFFUSION_35,
        "SD 3.5 (Medium, Large)",
        SD3,
        1024,
        False,
        False,
        _SD35_SAMPLE,
        released_parts={"transformer": ref.SD35_LARGE_TRANSFORMER, **_SD3_ENCODERS},
        released_variants=(("medium", {"transformer": ref.SD35_MEDIUM_TRANSFORMER}),),
    ),
)
