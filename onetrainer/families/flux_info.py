"""Flux.1 (dev, schnell, Fill, Kontext) and Chroma: a transformer of double- and single-stream blocks over 2x2-packed
16-channel latents.

The declaration of `flux.py`'s families (torch-free: the config and the GUI read it through
`config/model_types.py`): their model types, parts, formats, capabilities, layer presets, notes and sample defaults.
"""

from __future__ import annotations

import dataclasses

from onetrainer.config.enums import ModelFormat, ModelType, NoiseScheduler, TrainingMethod
from onetrainer.config.family_info import (
    ALL_METHODS,
    FLOW_MATCHING,
    GGUF_FILE,
    GUIDANCE_INPUT,
    LAYER_OFFLOADING,
    LAYER_SKIP,
    OWN_MODEL,
    REFERENCE_IMAGES,
    SEQUENCE_LENGTH,
    TEXT_PADDING_MASK,
    FamilyInfo,
    FileCaveat,
    ModelTypeInfo,
    PartRole,
    SampleDefaults,
)
from onetrainer.families import reference_configs as ref
from onetrainer.families.lora_caveats import text_encoder_caveat

# What other tools make of a LoRA file (`FileCaveat`). diffusers' load_lora_weights: drops a Flux T5 LoRA without an
# error, refuses a Chroma file with one, refuses a kohya file with Chroma's approximator (`distilled_guidance_layer`,
# Chroma1's five layers), and its kohya converter names the modules outside the numbered blocks (img_in, txt_in,
# time_in, vector_in, guidance_in, final_layer) without the `transformer.` prefix it then loads by, dropping them
# without a word. ComfyUI drops Chroma's approximator from a DIFFUSERS_LORA file
# (`lora_caveats.py`: and every text encoder's LoRA but CLIP's).
_FLUX_FORMATS = {
    TrainingMethod.FINE_TUNE: (ModelFormat.DIFFUSERS, ModelFormat.ORIGINAL_TRANSFORMER, ModelFormat.LEGACY_SAFETENSORS),
    TrainingMethod.LORA: (ModelFormat.DIFFUSERS_LORA, ModelFormat.KOHYA_LORA),
    TrainingMethod.EMBEDDING: (ModelFormat.SAFETENSORS,),
}
_FLUX_LAYER_PRESETS = {
    "attn-mlp": ("attn", "ff.net", "proj_mlp"),
    "attn-only": ("attn",),
    "blocks": ("transformer_block",),
    "full": (),
}
_FLUX_NOTE = (
    " The VAE's latents are shifted and scaled ((z - 0.1159) x 0.3611) and packed 2x2 into the transformer's tokens: "
    "training sizes and sample sizes go in steps of 16 px. Samples render through diffusers' pipeline with the "
    "model's flow-matching Euler sampler (its resolution-dependent shift), whichever sampler is chosen. "
    "`transformer.model_name` may name a transformer file in Black Forest Labs' layout (`flux1-dev.safetensors`, "
    "Chroma's single files; ComfyUI's `model.diffusion_model.` prefix too) to train instead of the base model's; "
    "ORIGINAL_TRANSFORMER writes that layout. KOHYA_LORA writes the transformer's LoRA over the original names "
    "(exact fused q/k/v and linear1), as ComfyUI, Forge and sd-scripts read it; diffusers' `load_lora_weights` reads "
    "the numbered blocks of such a file, and of a DIFFUSERS_LORA file the transformer and CLIP-L, never T5 (a "
    "Chroma DIFFUSERS_LORA file with T5 weights is refused by diffusers)."
)
_FLUX_T5_CAVEAT = text_encoder_caveat(
    "text_encoder_2",
    "diffusers' FluxPipeline.load_lora_weights skips the T5 LoRA of a DIFFUSERS_LORA file without an error (it "
    "changes only the transformer and CLIP-L), and KOHYA_LORA keeps it under sd-scripts' lora_te3_ names",
)
_CHROMA_T5_CAVEAT = text_encoder_caveat(
    "text_encoder",
    "diffusers' ChromaPipeline.load_lora_weights refuses a DIFFUSERS_LORA file that holds a T5 LoRA (train the "
    "transformer only for diffusers, or save KOHYA_LORA)",
)
_CHROMA_APPROXIMATOR = (
    "distilled_guidance_layer.in_proj",
    *(f"distilled_guidance_layer.layers.{n}.linear_{i}" for n in range(5) for i in (1, 2)),
    "distilled_guidance_layer.out_proj",
)
_CHROMA_APPROXIMATOR_CAVEAT = FileCaveat(
    ModelFormat.KOHYA_LORA,
    "the layer filter puts LoRA on Chroma's approximator (distilled_guidance_layer): ComfyUI reads such a KOHYA_LORA "
    "file, diffusers' load_lora_weights refuses it; the attn-mlp filter (OneTrainer's presets) leaves it out",
    modules=_CHROMA_APPROXIMATOR,
)
_CHROMA_APPROXIMATOR_DIFFUSERS_CAVEAT = FileCaveat(
    ModelFormat.DIFFUSERS_LORA,
    "the layer filter also trains the approximator (distilled_guidance_layer): ComfyUI drops its LoRA from a "
    "DIFFUSERS_LORA file (diffusers reads it); save KOHYA_LORA for ComfyUI, or use the attn-mlp filter (OneTrainer's "
    "presets), which leaves it out",
    modules=_CHROMA_APPROXIMATOR,
)
_OUTSIDE_BLOCKS = (
    "the layer filter puts LoRA on modules outside the numbered blocks ({modules}; img_in, txt_in, {original} in the "
    "original names): diffusers' load_lora_weights drops them from a KOHYA_LORA file without a word (ComfyUI and "
    "Forge read them); the attn-mlp filter (OneTrainer's presets) leaves them out"
)
_FLUX_OUTSIDE_BLOCKS_CAVEAT = FileCaveat(
    ModelFormat.KOHYA_LORA,
    _OUTSIDE_BLOCKS.format(
        modules="x_embedder, context_embedder, time_text_embed, norm_out, proj_out",
        original="time_in, vector_in, guidance_in, final_layer",
    ),
    modules=(
        "x_embedder",
        "context_embedder",
        *(f"time_text_embed.{e}_embedder.linear_{i}" for e in ("timestep", "guidance", "text") for i in (1, 2)),
        "norm_out.linear",
        "proj_out",
    ),
)
_CHROMA_OUTSIDE_BLOCKS_CAVEAT = FileCaveat(
    ModelFormat.KOHYA_LORA,
    _OUTSIDE_BLOCKS.format(modules="x_embedder, context_embedder, proj_out", original="final_layer"),
    modules=("x_embedder", "context_embedder", "proj_out"),
)
FLUX = FamilyInfo(
    key="flux",
    label="Flux.1",
    part_roles={
        "transformer": PartRole.DENOISER,
        "text_encoder": PartRole.TEXT_ENCODER,
        "text_encoder_2": PartRole.TEXT_ENCODER,
        "vae": PartRole.IMAGE_ENCODER,
    },
    bucket_step=16,
    sample_step=16,
    methods=ALL_METHODS,
    output_formats=_FLUX_FORMATS,
    muon_hidden_layers=("transformer_blocks", "encoder.block", "encoder.layers"),  # T5 blocks, CLIP layers
    layer_presets=_FLUX_LAYER_PRESETS,
    hub_parts=("transformer", "text_encoder", "text_encoder_2", "vae"),
    capabilities=frozenset({LAYER_SKIP, GUIDANCE_INPUT, FLOW_MATCHING, TEXT_PADDING_MASK}),
    part_capabilities={
        "transformer": frozenset({OWN_MODEL, LAYER_OFFLOADING, GGUF_FILE}),
        "vae": frozenset({OWN_MODEL}),
        "text_encoder_2": frozenset({SEQUENCE_LENGTH, LAYER_OFFLOADING}),
    },
    file_caveats=(_FLUX_T5_CAVEAT, _FLUX_OUTSIDE_BLOCKS_CAVEAT),
    notes="`text_encoder` is CLIP-L (only its pooled output conditions the transformer, so its clip skip changes "
    "nothing, as in OneTrainer), `text_encoder_2` T5-XXL, prompted with `text_encoder_2_sequence_length` tokens "
    "in training and samples (OneTrainer's default 77; empty: the model's own 512, 256 for schnell). One model "
    "type covers dev and schnell: the transformer's config says which (schnell has no guidance input). Training "
    "feeds dev and Fill the fixed `transformer.guidance_scale` (OneTrainer's name and default, 1.0); a sample's "
    "CFG scale is the distilled guidance the transformer gets (3.5 for dev; Fill 30), with no second, "
    "unconditioned pass and no negative prompt; schnell samples in 4 steps with no guidance by default "
    "(`scripts/sample.py --prompt`). T5 sees its padding and so does the transformer, as BFL's code has it; "
    "`transformer.attention_mask` (OneTrainer's \"Force attention mask\") zeroes the padding's hidden states in "
    "training and samples. Fill (FLUX_FILL_DEV_1) trains on the concepts' masks (`<name>-masklabel.png`, white = "
    "repaint) with the masked image's latents and the mask as extra inputs." + _FLUX_NOTE,
)
FLUX_KONTEXT = dataclasses.replace(
    FLUX,
    key="flux_kontext",
    label="Flux.1 Kontext",
    reference_images=True,
    references_required=False,
    max_references=1,
    capabilities=FLUX.capabilities | {REFERENCE_IMAGES},
    notes="Flux.1 Kontext [dev] learns to change a reference image as the caption says: the training image is the "
    "result, its one reference image (`<name>-reference.<ext>`) the input; an image with two or more (numbered "
    "`<name>-reference-1.<ext>`, `-2`, …) is named and skipped (Kontext takes one), and an image without one trains "
    "the model as plain text to image (a batch holds images of one kind). The reference's latents (the VAE's mode, "
    "shifted and scaled as the image's) are packed as the image's and join the transformer's sequence after them, "
    "their position ids offset (first id 1), as FluxKontextPipeline feeds them; the loss covers the result's tokens. "
    "The reference is used at its own size (the image's crop applied, at most 1024x1024 px, sides rounded down to "
    "16 px), not resized to the pipeline's preferred Kontext resolutions: samples pass `_auto_resize=False` to match. "
    "The references' latents are cached with their image; train with batch size 1 unless every reference of a batch "
    "has one size. A sample takes one `reference_images` entry, or none for a text-to-image sample. The text "
    "encoders, guidance (`transformer.guidance_scale` in training, the sample's CFG scale as the distilled guidance, "
    "2.5 in BFL's examples, 3.5 diffusers' default), "
    "LoRA files and fine-tunes are Flux.1 dev's." + _FLUX_NOTE,
)
CHROMA = FamilyInfo(
    key="chroma",
    label="Chroma",
    part_roles={"transformer": PartRole.DENOISER, "text_encoder": PartRole.TEXT_ENCODER, "vae": PartRole.IMAGE_ENCODER},
    bucket_step=16,
    sample_step=16,
    methods=ALL_METHODS,
    output_formats=_FLUX_FORMATS,
    muon_hidden_layers=("transformer_blocks", "encoder.block"),
    layer_presets=_FLUX_LAYER_PRESETS,
    hub_parts=("transformer", "text_encoder", "vae"),
    capabilities=frozenset({LAYER_SKIP, FLOW_MATCHING}),
    part_capabilities={
        "transformer": frozenset({OWN_MODEL, LAYER_OFFLOADING, GGUF_FILE}),
        "text_encoder": frozenset({LAYER_OFFLOADING}),
        "vae": frozenset({OWN_MODEL}),
    },
    file_caveats=(
        _CHROMA_T5_CAVEAT,
        _CHROMA_APPROXIMATOR_CAVEAT,
        _CHROMA_APPROXIMATOR_DIFFUSERS_CAVEAT,
        _CHROMA_OUTSIDE_BLOCKS_CAVEAT,
    ),
    notes="`text_encoder` is T5-XXL (512 tokens), whose attention mask also reaches the transformer (the padding "
    "masked, all but its first token). Samples use real classifier-free guidance with the negative prompt. A LoRA on "
    "the approximator (`distilled_guidance_layer`, which the `full` layer filter includes) is read by ComfyUI, but "
    "makes diffusers refuse a KOHYA_LORA file: OneTrainer's presets train `attn-mlp`." + _FLUX_NOTE,
)

# diffusers' pipeline defaults: dev 28 steps at distilled guidance 3.5, Fill at 30, Chroma 35 steps at CFG 5.
_FLUX_SAMPLE = SampleDefaults(1024, 1024, 28, 3.5, NoiseScheduler.EULER)
_FLUX_FILL_SAMPLE = SampleDefaults(1024, 1024, 28, 30.0, NoiseScheduler.EULER)
_FLUX_KONTEXT_SAMPLE = SampleDefaults(1024, 1024, 28, 3.5, NoiseScheduler.EULER)
_CHROMA_SAMPLE = SampleDefaults(1024, 1024, 35, 5.0, NoiseScheduler.EULER)

_FLUX_ENCODERS = {"text_encoder": ref.CLIP_L_TEXT, "text_encoder_2": ref.T5_XXL_ENCODER, "vae": ref.FLUX_VAE}

# The model types this module declares, in the order the model-type menu lists them.
MODEL_TYPES: tuple[ModelTypeInfo, ...] = (
    ModelTypeInfo(
        ModelType.FLUX_DEV_1,
        "Flux.1 Dev / Schnell",
        FLUX,
        1024,
        False,
        False,
        _FLUX_SAMPLE,
        released_parts={"transformer": ref.FLUX_DEV_TRANSFORMER, **_FLUX_ENCODERS},
    ),
    ModelTypeInfo(
        ModelType.FLUX_FILL_DEV_1,
        "Flux.1 Fill Dev",
        FLUX,
        1024,
        False,
        True,
        _FLUX_FILL_SAMPLE,
        released_parts={"transformer": ref.FLUX_FILL_TRANSFORMER, **_FLUX_ENCODERS},
    ),
    ModelTypeInfo(
        ModelType.FLUX_KONTEXT_DEV_1,
        "Flux.1 Kontext Dev",
        FLUX_KONTEXT,
        1024,
        False,
        False,
        _FLUX_KONTEXT_SAMPLE,
        # FLUX.1-Kontext-dev's transformer has FLUX.1-dev's config (64 packed channels in and out, a guidance input)
        released_parts={"transformer": ref.FLUX_DEV_TRANSFORMER, **_FLUX_ENCODERS},
    ),
    ModelTypeInfo(
        ModelType.CHROMA_1,
        "Chroma1",
        CHROMA,
        1024,
        False,
        False,
        _CHROMA_SAMPLE,
        released_parts={
            "transformer": ref.CHROMA_TRANSFORMER,
            "text_encoder": ref.T5_XXL_ENCODER,
            "vae": ref.FLUX_VAE,
        },
    ),
)
