"""HunyuanVideo 1.5 (text to video): a dual-stream DiT over the latents of its own causal video VAE, conditioned on
Qwen2.5-VL and, for the quoted text of a prompt, the ByT5 glyph encoder.

The declaration of `hunyuan_video15.py`'s family (torch-free: the config and the GUI read it through
`config/model_types.py`): its model type, parts, formats, capabilities, layer presets, notes and sample defaults.
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
from onetrainer.util.layer_filter import RegexPatterns

# The dual-stream blocks' attention (the latents' q, k, v, out and the text's added q, k, v, out) and feed-forwards
# (the latents' and the text's), not those of the token refiner in front of them (`context_embedder`), whose modules
# have the same names.
_BLOCK_ATTENTION = r"^transformer_blocks\.\d+\.attn\."
_BLOCK_FEED_FORWARD = r"^transformer_blocks\.\d+\.ff(_context)?\."
_LAYER_PRESETS = {
    "attn-mlp": RegexPatterns((_BLOCK_ATTENTION, _BLOCK_FEED_FORWARD)),
    "attn-only": RegexPatterns((_BLOCK_ATTENTION,)),
    "blocks": ("transformer_blocks",),
    "full": (),
}

_KOHYA_IN_DIFFUSERS_NAMES = (
    "KOHYA_LORA names each module `lora_unet_` + its diffusers path (`lora_unet_transformer_blocks_0_attn_to_q`; "
    "`lora_te1_` Qwen2.5-VL, `lora_te2_` ByT5), the layout this trainer reads back; for ComfyUI write COMFY_LORA"
)
_COMFY_UNCHECKED = (
    "COMFY_LORA names the transformer's modules as ComfyUI's HunyuanVideo model does (Flux's double-stream blocks: "
    "`double_blocks.N.img_attn.qkv`, each stream's q, k and v one fused LoRA; the token refiner's `self_attn.qkv`); "
    "those names were not checked against a ComfyUI build here. LoHa, LoKr and DoRA keep q, k and v apart under "
    "diffusers' paths, which ComfyUI does not map"
)

HUNYUAN_VIDEO15 = FamilyInfo(
    key="hunyuan_video15",
    label="HunyuanVideo 1.5",
    part_roles={
        "transformer": PartRole.DENOISER,
        "text_encoder": PartRole.TEXT_ENCODER,
        "text_encoder_2": PartRole.TEXT_ENCODER,
        "vae": PartRole.IMAGE_ENCODER,
    },
    # the VAE downsamples 16x and the transformer takes 1x1 patches: a token is 16 px
    bucket_step=16,
    sample_step=16,
    methods=(TrainingMethod.LORA, TrainingMethod.FINE_TUNE, TrainingMethod.EMBEDDING),
    output_formats={
        TrainingMethod.LORA: (ModelFormat.DIFFUSERS_LORA, ModelFormat.COMFY_LORA, ModelFormat.KOHYA_LORA),
        TrainingMethod.FINE_TUNE: (ModelFormat.DIFFUSERS,),
        TrainingMethod.EMBEDDING: (ModelFormat.SAFETENSORS,),
    },
    muon_hidden_layers=("transformer_blocks", "layers", "encoder.block"),  # the DiT blocks, Qwen's layers, ByT5's
    layer_presets=_LAYER_PRESETS,
    hub_parts=("transformer", "text_encoder", "text_encoder_2", "vae"),
    capabilities=frozenset({FLOW_MATCHING}),
    part_capabilities={
        "transformer": frozenset({LAYER_OFFLOADING}),
        "text_encoder": frozenset({LAYER_OFFLOADING}),
    },
    file_caveats=(
        text_encoder_caveat(
            "text_encoder",
            "diffusers' HunyuanVideo15Pipeline has no LoRA loader: a DIFFUSERS_LORA file loads into its transformer "
            "with `pipe.transformer.load_lora_adapter(file, prefix='transformer')`, which reads no text-encoder LoRA",
        ),
        FileCaveat(ModelFormat.KOHYA_LORA, _KOHYA_IN_DIFFUSERS_NAMES),
        FileCaveat(ModelFormat.COMFY_LORA, _COMFY_UNCHECKED),
    ),
    video=FrameCounts(),
    notes="A video model: a concept's clips train as windows of 4k + 1 frames (its `video` settings; the run's "
    "`frames`) and its stills as one-frame clips; a batch holds one frame count. `text_encoder` is Qwen2.5-VL-7B's "
    "decoder: as HunyuanVideo15Pipeline encodes them, captions are written into its chat template after the "
    "pipeline's system message, padded and cut to 1108 tokens, the first 108 cut off again, and the third-last "
    "layer's states of the rest kept (up to 1000 tokens, with their mask; the text cache keeps each caption's "
    'tokens). `text_encoder_2` is the ByT5 glyph encoder: the quoted text of a caption ("…" or “…”) is read as '
    '`Text "…". ` (256 bytes at most); a caption without quotes gives it nothing (masked zeros). The transformer '
    "reads both through their masks, with the image-condition inputs of text to video (zeros, masked). Caption "
    "dropout encodes the empty caption (the pipeline's negative prompt). The VAE is HunyuanVideo 1.5's causal 3-D "
    "VAE (16x spatial, 4x temporal after the first frame; in spatial tiles of 256 px above that size, as the "
    "pipeline's example runs it), its 32-channel latents scaled by 1.03682; the latents of a clip are 5-D, "
    "[32, (F − 1)/4 + 1, H/16, W/16], and a loss mask (one per clip) applies to every latent frame. "
    "Training is rectified flow (the transformer takes σ·1000); `timestep_shift` shifts the training times as the "
    "model's sampler shifts its own (5 for the 480p model). Samples run HunyuanVideo15Pipeline with the model's own "
    "flow-matching Euler sampler and classifier-free guidance at the sample's scale, and are clips of the sample's "
    "`frames` (4k + 1; a still at 1) at 24 fps. LoRA files: DIFFUSERS_LORA (peft names under `transformer.`; the "
    "pipeline has no `load_lora_weights`: load it with `pipe.transformer.load_lora_adapter`), COMFY_LORA "
    "(`diffusion_model.` + ComfyUI's module names, each stream's q, k, v one fused LoRA) or KOHYA_LORA (`lora_unet_` + "
    "the diffusers module path). Fine-tunes: a diffusers folder "
    "(also the backup, usable as a base model). Embeddings: new tokens of Qwen2.5-VL (file key `qwen`; the "
    "template's cut at 108 tokens is before the caption, so the pipeline reads them as we do) and, where a placeholder "
    "is quoted, of the glyph encoder (`byt5`).",
)

# The model types this module declares, in the order the model-type menu lists them.
MODEL_TYPES: tuple[ModelTypeInfo, ...] = (
    ModelTypeInfo(
        ModelType.HUNYUAN_VIDEO_15,
        "HunyuanVideo 1.5",
        HUNYUAN_VIDEO15,
        480,
        False,
        False,
        SampleDefaults(848, 480, 50, ref.HUNYUAN_VIDEO15_480P_GUIDANCE_SCALE, NoiseScheduler.EULER),
        released_parts={
            "transformer": ref.HUNYUAN_VIDEO15_480P_T2V_TRANSFORMER,
            "text_encoder": ref.QWEN25_VL_7B_TEXT_MODEL,
            "text_encoder_2": ref.BYT5_SMALL_ENCODER,
            "vae": ref.HUNYUAN_VIDEO15_VAE,
        },
    ),
)
