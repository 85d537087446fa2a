"""Wan 2.1 (text to video): a 3-D DiT over the latents of Wan's causal video VAE, conditioned on UMT5. The first video
family: its concepts train clips (and stills as one-frame clips).

The declaration of `wan.py`'s family (torch-free: the config and the GUI read it through `config/model_types.py`): its
model type, parts, formats, capabilities, layer presets, notes and sample defaults.
"""

from __future__ import annotations

from onetrainer.config.enums import ModelFormat, ModelType, NoiseScheduler, TrainingMethod
from onetrainer.config.family_info import (
    FLOW_MATCHING,
    LAYER_OFFLOADING,
    FamilyInfo,
    FileCaveat,
    FrameCounts,
    ModelTypeInfo,
    PartRole,
    SampleDefaults,
)
from onetrainer.families import reference_configs as ref
from onetrainer.families.lora_caveats import text_encoder_caveat

# The layers musubi-tuner and diffusers' Wan LoRAs train (every linear layer of the blocks: self- and cross-attention's
# q, k, v, o and the feed-forward's two), matched as substrings of diffusers' module paths.
_WAN_LAYER_PRESETS = {
    "attn-mlp": ("attn1", "attn2", "ffn"),
    "attn-only": ("attn1", "attn2"),
    "blocks": ("blocks",),
    "full": (),
}
_KOHYA_NEEDS_EVERY_LAYER = (
    "diffusers' Wan LoRA converter reads a KOHYA_LORA (musubi-tuner) file only when it holds every block's self- and "
    "cross-attention q, k, v, o and both feed-forward layers and no text-encoder LoRA (the attn-mlp and blocks "
    "presets give that); musubi-tuner and ComfyUI read any such file"
)

WAN21 = FamilyInfo(
    key="wan",
    label="Wan 2.1",
    part_roles={"transformer": PartRole.DENOISER, "text_encoder": PartRole.TEXT_ENCODER, "vae": PartRole.IMAGE_ENCODER},
    # the VAE downsamples 8x and the transformer takes 2x2 patches: a token is 16 px
    bucket_step=16,
    sample_step=16,
    methods=(TrainingMethod.LORA, TrainingMethod.FINE_TUNE, TrainingMethod.EMBEDDING),
    output_formats={
        TrainingMethod.LORA: (ModelFormat.DIFFUSERS_LORA, ModelFormat.COMFY_LORA, ModelFormat.KOHYA_LORA),
        TrainingMethod.FINE_TUNE: (ModelFormat.DIFFUSERS,),
        TrainingMethod.EMBEDDING: (ModelFormat.SAFETENSORS,),
    },
    muon_hidden_layers=("blocks", "encoder.block"),  # the DiT blocks, UMT5's encoder blocks
    layer_presets=_WAN_LAYER_PRESETS,
    hub_parts=("transformer", "text_encoder", "vae"),
    capabilities=frozenset({FLOW_MATCHING}),
    part_capabilities={
        "transformer": frozenset({LAYER_OFFLOADING}),
        "text_encoder": frozenset({LAYER_OFFLOADING}),
    },
    file_caveats=(
        text_encoder_caveat(
            "text_encoder",
            "diffusers' WanPipeline.load_lora_weights reads the transformer's part of a DIFFUSERS_LORA file, not the "
            "UMT5 LoRA",
        ),
        FileCaveat(ModelFormat.KOHYA_LORA, _KOHYA_NEEDS_EVERY_LAYER),
    ),
    video=FrameCounts(),
    notes="A video model: a concept's clips train as windows of 4k + 1 frames (its `video` settings; the run's "
    "`frames`) and its stills as one-frame clips; a batch holds one frame count. `text_encoder` is UMT5-XXL: as "
    "WanPipeline encodes them, captions are cleaned (ftfy, whitespace), padded and cut to 512 tokens, and the "
    "transformer cross-attends to each caption's states followed by zeros up to 512 (the text cache keeps the "
    "caption's tokens only). Caption dropout encodes the empty caption (the pipeline's negative prompt). The VAE is "
    "Wan's causal 3-D VAE (8x spatial, 4x temporal after the first frame), its latents normalised per channel; the "
    "latents of a clip are 5-D, [16, (F − 1)/4 + 1, H/8, W/8], and a loss mask (one per clip) applies to every "
    "latent frame. Training is rectified flow (the transformer takes σ·1000); `timestep_shift` shifts the training "
    "times as the pipeline's `flow_shift` shifts the sampler's. Samples run WanPipeline with the model's own UniPC "
    "sampler, CFG and the negative prompt, and are clips of the sample's `frames` (4k + 1; a still at 1). LoRA files: "
    "DIFFUSERS_LORA (WanPipeline's `load_lora_weights`), COMFY_LORA (`diffusion_model.` + Wan's own module names, "
    "what ComfyUI loads) or KOHYA_LORA (`lora_unet_` + Wan's names, musubi-tuner's layout); diffusers' converters "
    "read both. Fine-tunes: a diffusers folder (also the backup, usable as a base model).",
)
_WAN21_SAMPLE = SampleDefaults(832, 480, 50, 5.0, NoiseScheduler.UNIPC)

# The model types this module declares, in the order the model-type menu lists them.
MODEL_TYPES: tuple[ModelTypeInfo, ...] = (
    ModelTypeInfo(
        ModelType.WAN_2_1,
        "Wan 2.1",
        WAN21,
        480,
        False,
        False,
        _WAN21_SAMPLE,
        released_parts={
            "transformer": ref.WAN21_T2V_1_3B_TRANSFORMER,
            "text_encoder": ref.UMT5_XXL_ENCODER,
            "vae": ref.WAN_VAE,
        },
        released_variants=(("14b", {"transformer": ref.WAN21_T2V_14B_TRANSFORMER}),),
    ),
)
