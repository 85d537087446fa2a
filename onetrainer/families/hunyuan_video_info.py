"""HunyuanVideo (text to video): double- and single-stream transformer blocks over the latents of HunyuanVideo's causal
video VAE, conditioned on a Llama's hidden states (through a token refiner) and CLIP-L's pooled output, guidance
distilled. A video family: its concepts train clips (and stills as one-frame clips).

The declaration of `hunyuan_video.py`'s family (torch-free: the config and the GUI read it through
`config/model_types.py`): its model type, parts, formats, capabilities, layer presets, notes and sample defaults.
"""

from __future__ import annotations

from onetrainer.config.enums import ModelFormat, ModelType, NoiseScheduler, TrainingMethod
from onetrainer.config.family_info import (
    FLOW_MATCHING,
    GUIDANCE_INPUT,
    LAYER_OFFLOADING,
    LAYER_SKIP,
    FamilyInfo,
    FileCaveat,
    FrameCounts,
    ModelTypeInfo,
    PartRole,
    SampleDefaults,
)
from onetrainer.config.model_types import ALL_METHODS
from onetrainer.families import reference_configs as ref
from onetrainer.families.lora_caveats import text_encoder_caveat

_DIFFUSERS_READS = "diffusers' HunyuanVideoPipeline.load_lora_weights reads the transformer's part of a DIFFUSERS_LORA"
_DIFFUSERS_CONVERTER = (
    "diffusers' HunyuanVideo converter reads the double blocks of such a file; it splits a single block's linear1 at "
    "the released model's width only, refuses a LoRA on the token refiner's fused q/k/v (the attn presets include "
    "it), and drops the modules outside the blocks; ComfyUI reads the whole file"
)
_MUSUBI_ONLY = (
    "musubi-tuner reads it (its convert_lora.py --target other writes the COMFY_LORA layout, what ComfyUI reads); "
    "ComfyUI maps only some `lora_unet_` names of HunyuanVideo (its own modules are named otherwise) and diffusers' "
    "HunyuanVideo loader none"
)

HUNYUAN_VIDEO = FamilyInfo(
    key="hunyuan_video",
    label="HunyuanVideo",
    part_roles={
        "transformer": PartRole.DENOISER,
        "text_encoder": PartRole.TEXT_ENCODER,
        "text_encoder_2": PartRole.TEXT_ENCODER,
        "vae": PartRole.IMAGE_ENCODER,
    },
    # the VAE downsamples 8x and the transformer takes 2x2 patches: a token is 16 px (the pipeline asks for 16)
    bucket_step=16,
    sample_step=16,
    methods=ALL_METHODS,
    output_formats={
        TrainingMethod.FINE_TUNE: (ModelFormat.DIFFUSERS,),
        TrainingMethod.LORA: (ModelFormat.DIFFUSERS_LORA, ModelFormat.COMFY_LORA, ModelFormat.KOHYA_LORA),
        TrainingMethod.EMBEDDING: (ModelFormat.SAFETENSORS,),
    },
    # OneTrainer's HunyuanVideo presets (BaseHunyuanVideoSetup.LAYER_PRESETS), matched as substrings of module paths
    layer_presets={
        "attn-mlp": ("attn", "ff.net", "proj_mlp"),
        "attn-only": ("attn",),
        "blocks": ("transformer_block",),
        "full": (),
    },
    # the double- and single-stream blocks, Llama's layers, CLIP's layers
    muon_hidden_layers=("transformer_blocks", "layers"),
    hub_parts=("transformer", "text_encoder", "text_encoder_2", "vae"),
    capabilities=frozenset({FLOW_MATCHING, GUIDANCE_INPUT, LAYER_SKIP}),
    part_capabilities={
        "transformer": frozenset({LAYER_OFFLOADING}),
        "text_encoder": frozenset({LAYER_OFFLOADING}),
    },
    file_caveats=(
        *(
            text_encoder_caveat(part, f"{_DIFFUSERS_READS} file, not the {name} LoRA")
            for part, name in (("text_encoder", "Llama"), ("text_encoder_2", "CLIP-L"))
        ),
        FileCaveat(ModelFormat.COMFY_LORA, _DIFFUSERS_CONVERTER),
        FileCaveat(ModelFormat.KOHYA_LORA, _MUSUBI_ONLY),
    ),
    video=FrameCounts(),
    notes="A video model: a concept's clips train as windows of 4k + 1 frames (its `video` settings; the run's "
    "`frames`) and its stills as one-frame clips; a batch holds one frame count. `text_encoder` is the Llama of "
    "LLaVA-Llama-3-8B, `text_encoder_2` CLIP-L. As HunyuanVideoPipeline.encode_prompt: the caption goes into the "
    "pipeline's prompt template, padded and cut to 256 tokens after the template's 95, and the Llama's third-last "
    "hidden states of the caption's tokens (the template's cropped off) with their mask are what the transformer's "
    "token refiner reads (`text_encoder.layer_skip` reads an earlier layer); CLIP-L's pooled output (77 tokens) joins "
    "the time embedding. The text cache keeps each caption's tokens only (the transformer masks the padding). "
    "Caption dropout zeroes each encoder's share on its own draw, as OneTrainer does. HunyuanVideo is guidance "
    "distilled: training feeds the fixed `transformer.guidance_scale` (OneTrainer's name and default, 1.0) · 1000, "
    "samples the sample's CFG scale as the distilled guidance (the pipeline's 6.0), with no unconditioned pass and no "
    "negative prompt. The VAE is HunyuanVideo's causal 3-D VAE (8x spatial, 4x temporal after the first frame), its "
    "latents scaled by its `scaling_factor`; a clip's latents are 5-D, [16, (F − 1)/4 + 1, H/8, W/8], and a loss mask "
    "(one per clip) applies to every latent frame. Training is rectified flow (the transformer takes σ·1000); "
    "`timestep_shift` shifts the training times (the model samples at shift 7). Samples run HunyuanVideoPipeline "
    "with the model's own flow-matching Euler sampler and are clips of the sample's `frames` (4k + 1; a still at 1) "
    "at 24 fps. LoRA files: DIFFUSERS_LORA (peft names under `transformer.`; HunyuanVideoPipeline's "
    "`load_lora_weights`), COMFY_LORA (diffusion-pipe's layout, which ComfyUI maps: `diffusion_model.` + the "
    "original module names, `.lora_A`/`.lora_B` with the scale folded in, q/k/v and a single block's linear1 as one "
    "exact LoRA on the fused layer) or KOHYA_LORA (musubi-tuner's: `lora_unet_` + the original names with alphas); "
    "LoHa and LoKr keep each projection of a fused layer under `lora_transformer_` + its diffusers name (read back "
    "here). Embeddings train on both text encoders (`llama`, `clip_l` in the file, OneTrainer's keys). Fine-tunes: a "
    "diffusers folder (also the backup, usable as a base model).",
)
# diffusers' pipeline defaults: 720x1280, 50 steps, distilled guidance 6.0, on the model's flow-matching Euler sampler
_HUNYUAN_VIDEO_SAMPLE = SampleDefaults(1280, 720, 50, 6.0, NoiseScheduler.EULER)

# The model types this module declares, in the order the model-type menu lists them.
MODEL_TYPES: tuple[ModelTypeInfo, ...] = (
    ModelTypeInfo(
        ModelType.HUNYUAN_VIDEO,
        "HunyuanVideo",
        HUNYUAN_VIDEO,
        720,
        False,
        False,
        _HUNYUAN_VIDEO_SAMPLE,
        released_parts={
            "transformer": ref.HUNYUAN_VIDEO_TRANSFORMER,
            "text_encoder": ref.HUNYUAN_VIDEO_LLAMA_TEXT,
            "text_encoder_2": ref.CLIP_L_TEXT,
            "vae": ref.HUNYUAN_VIDEO_VAE,
        },
    ),
)
