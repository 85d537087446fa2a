"""Wan 2.1 image to video (14B 480p / 720p): Wan 2.1's DiT with image cross-attention and the start image's latents
beside the noisy ones, conditioned on UMT5 and a CLIP vision encoder.

The declaration of `wan_i2v.py`'s family (torch-free): its model type, parts, formats, capabilities, notes and sample
defaults. Its own model type (not a variant found in the folder): its parts (the image encoder) and its samples (which
need a start image) differ from text to video's before any model is read, as the model-type menu offers them.
"""

from __future__ import annotations

import dataclasses

from onetrainer.config.enums import ModelType, NoiseScheduler
from onetrainer.config.family_info import (
    FLOW_MATCHING,
    REFERENCE_IMAGES,
    ModelTypeInfo,
    PartRole,
    SampleDefaults,
)
from onetrainer.families import reference_configs as ref
from onetrainer.families.wan_info import WAN21

IMAGE_NOTES = (
    "Wan 2.1 I2V generates a clip from a start image: the transformer takes the noisy latents with 4 mask channels "
    "(the start frame known) and the VAE latents of the start image followed by black frames (36 channels), and "
    "cross-attends to the CLIP vision encoder's states of the start image (`image_encoder`, the penultimate layer's "
    "257) beside the text. Training: each clip's first frame is its start image (its condition latents and CLIP "
    "states are cached with its latents); a still trains as a one-frame clip whose start image is itself, which "
    "teaches little beyond keeping the start image: train I2V on clips. Caption dropout drops the text only (the "
    "start image always conditions, as in the pipeline). Samples run WanImageToVideoPipeline from the sample's start "
    "image: its one reference image (`reference_images`, required), which the pipeline resizes to the sample's size. "
    "LoRA files name the image cross-attention's projections too (diffusers' `attn2.add_k_proj` / `add_v_proj`, Wan's "
    "`cross_attn.k_img` / `v_img`, which the `attn-mlp` and `attn-only` presets train) and, with `full`, the image "
    "projection (`img_emb.proj.1` / `.3`). Fine-tunes write the WanImageToVideoPipeline folder with its image "
    "encoder and processor. Everything else is as Wan 2.1's: "
)

WAN21_I2V = dataclasses.replace(
    WAN21,
    key="wan_i2v",
    label="Wan 2.1 I2V",
    part_roles={
        "transformer": PartRole.DENOISER,
        "text_encoder": PartRole.TEXT_ENCODER,
        "vae": PartRole.IMAGE_ENCODER,
        "image_encoder": PartRole.IMAGE_ENCODER,
    },
    hub_parts=("transformer", "text_encoder", "vae", "image_encoder"),
    # samples take a start image through the reference-image setting; training takes each clip's first frame
    capabilities=frozenset({FLOW_MATCHING, REFERENCE_IMAGES}),
    references_required=True,
    max_references=1,
    notes=IMAGE_NOTES + WAN21.notes,
)

MODEL_TYPES: tuple[ModelTypeInfo, ...] = (
    ModelTypeInfo(
        ModelType.WAN_2_1_I2V,
        "Wan 2.1 I2V",
        WAN21_I2V,
        480,
        False,
        False,
        SampleDefaults(832, 480, 40, 5.0, NoiseScheduler.UNIPC),
        released_parts={
            "transformer": ref.WAN21_I2V_14B_TRANSFORMER,
            "text_encoder": ref.UMT5_XXL_ENCODER,
            "vae": ref.WAN_VAE,
            "image_encoder": ref.OPEN_CLIP_H_VISION,
        },
    ),
)
