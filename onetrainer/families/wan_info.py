"""Wan 2.1 (text to video): a 3-D DiT over the latents of Wan's causal video VAE, conditioned on UMT5. The first video
family: its concepts train clips (and stills as one-frame clips).

The declaration of `wan.py`'s family (torch-free: the config and the GUI read it through `config/model_types.py`): its
model type, parts, formats, capabilities, layer presets, notes and sample defaults.
"""

from __future__ import annotations

import dataclasses

from onetrainer.config.enums import ModelFormat, ModelType, NoiseScheduler, TrainingMethod
from onetrainer.config.family_info import (
    FLOW_MATCHING,
    LAYER_OFFLOADING,
    OWN_MODEL,
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
        TrainingMethod.FINE_TUNE: (ModelFormat.DIFFUSERS, ModelFormat.ORIGINAL_TRANSFORMER),
        TrainingMethod.EMBEDDING: (ModelFormat.SAFETENSORS,),
    },
    muon_hidden_layers=("blocks", "encoder.block"),  # the DiT blocks, UMT5's encoder blocks
    layer_presets=_WAN_LAYER_PRESETS,
    hub_parts=("transformer", "text_encoder", "vae"),
    capabilities=frozenset({FLOW_MATCHING}),
    part_capabilities={
        "transformer": frozenset({LAYER_OFFLOADING, OWN_MODEL}),
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
    "read both. Fine-tunes: a diffusers folder (also the backup, usable as a base model) or ORIGINAL_TRANSFORMER, the "
    "transformer alone in one file in Wan's own names (`blocks.N.self_attn.q`, `head.modulation`: ComfyUI's repackaged "
    "`split_files/diffusion_models/wan2.1_t2v_*.safetensors`, which ComfyUI, Wan's code and diffusers' "
    "`from_single_file` read); `transformer.model_name` reads such a file (ComfyUI's `model.diffusion_model.` prefix "
    "too) or a diffusers folder over the base's other parts.",
)
_WAN21_SAMPLE = SampleDefaults(832, 480, 50, 5.0, NoiseScheduler.UNIPC)

# Wan 2.2 A14B: two experts of one shape, the pipeline's `transformer` for the steps at σ ≥ its `boundary_ratio` (high
# noise), `transformer_2` for the rest (low noise); each a part of its own, with its own block (its `train`, weight
# dtype, offloading). A run trains either or both.
WAN22 = dataclasses.replace(
    WAN21,
    key="wan22",
    label="Wan 2.2",
    part_roles={
        "transformer": PartRole.DENOISER,
        "transformer_2": PartRole.DENOISER,
        "text_encoder": PartRole.TEXT_ENCODER,
        "vae": PartRole.IMAGE_ENCODER,
    },
    part_labels={"transformer": "Transformer (high noise)", "transformer_2": "Transformer 2 (low noise)"},
    expert_boundary=ref.WAN22_BOUNDARY_RATIO,
    expert_file_suffixes=("_high_noise", "_low_noise"),
    hub_parts=("transformer", "transformer_2", "text_encoder", "vae"),
    part_capabilities={
        "transformer": frozenset({LAYER_OFFLOADING, OWN_MODEL}),
        "transformer_2": frozenset({LAYER_OFFLOADING, OWN_MODEL}),
        "text_encoder": frozenset({LAYER_OFFLOADING}),
    },
    notes="Wan 2.2 (T2V A14B) has two experts: WanPipeline's `transformer` denoises the steps at σ ≥ the model's "
    "`boundary_ratio` (0.875: high noise) and `transformer_2` the rest (low noise); each is a part with its own "
    "settings. A run trains either or both: each expert whose `train` is on trains on the steps of its side of the "
    "boundary that the noising range reaches (`min_noising_strength` … `max_noising_strength`); a step's σ picks the "
    "expert, and a batch whose samples drew σ on both sides runs each expert on its own samples. The range must "
    "reach every trained expert's side and no frozen one's: the high-noise expert alone trains on 0.875 … 1 "
    "(`min_noising_strength` 0.875, `transformer_2`'s train off), the low-noise one alone on 0 … 0.875 "
    "(`max_noising_strength` 0.875, `transformer`'s train off), both on 0 … 1. An expert that does not train waits "
    "in CPU memory and joins the others on the device for samples. The validation loss (at σ 0.5) is the low-noise "
    "expert's where it steps. LoRA files: with one expert trained, one file "
    "(DIFFUSERS_LORA: WanPipeline's `load_lora_weights` loads it into `transformer`, or with "
    "`load_into_transformer_2=True` into `transformer_2`; COMFY_LORA / KOHYA_LORA: on that expert's model in ComfyUI "
    "and musubi-tuner); with both, one file per expert beside the destination, `<name>_high_noise.safetensors` and "
    "`<name>_low_noise.safetensors`, each holding that expert's LoRA under the `transformer` names (the text "
    "encoder's, if any, in the high-noise file). Fine-tunes write the pipeline folder with both experts in their "
    "places, or ORIGINAL_TRANSFORMER: a file per trained expert likewise (`_high_noise` / `_low_noise` where both "
    "train), as ComfyUI's repackaged Wan 2.2 files; each expert reads its own file as its `model_name`. Everything "
    "else is as Wan 2.1's: " + WAN21.notes,
)

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
    ModelTypeInfo(
        ModelType.WAN_2_2,
        "Wan 2.2",
        WAN22,
        480,
        False,
        False,
        SampleDefaults(832, 480, 40, 4.0, NoiseScheduler.UNIPC),
        released_parts={
            "transformer": ref.WAN22_T2V_A14B_TRANSFORMER,
            "transformer_2": ref.WAN22_T2V_A14B_TRANSFORMER,
            "text_encoder": ref.UMT5_XXL_ENCODER,
            "vae": ref.WAN_VAE,
        },
    ),
)
