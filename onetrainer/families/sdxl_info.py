"""Stable Diffusion XL 1.0: the UNet with two CLIP text encoders.

The declaration of `sdxl.py`'s families (torch-free: the config and the GUI read it through
`config/model_types.py`): their model types, parts, formats, capabilities, layer presets, notes and sample defaults.
"""

from __future__ import annotations

from onetrainer.config.enums import ModelType, NoiseScheduler
from onetrainer.config.family_info import (
    ALL_METHODS,
    OWN_MODEL,
    FamilyInfo,
    ModelTypeInfo,
    PartRole,
    SampleDefaults,
)
from onetrainer.families import reference_configs as ref
from onetrainer.families.sd_common_info import SD_CAPABILITIES, SD_LIKE_FORMATS, UNET_LAYER_PRESETS

SDXL = FamilyInfo(
    key="sdxl",
    label="Stable Diffusion XL",
    part_roles={
        "unet": PartRole.DENOISER,
        "text_encoder": PartRole.TEXT_ENCODER,
        "text_encoder_2": PartRole.TEXT_ENCODER,
        "vae": PartRole.IMAGE_ENCODER,
    },
    bucket_step=64,
    methods=ALL_METHODS,
    output_formats=SD_LIKE_FORMATS,
    muon_hidden_layers=("block", "encoder.layers"),
    layer_presets=UNET_LAYER_PRESETS,
    capabilities=SD_CAPABILITIES,
    part_capabilities={"vae": frozenset({OWN_MODEL})},
)
_SDXL_SAMPLE = SampleDefaults(1024, 1024, 30, 7.5, NoiseScheduler.EULER_A)

# The released models' parts as their diffusers configs (what the estimate counts a hub model not yet downloaded as).
_SDXL = {"vae": ref.SDXL_VAE, "text_encoder": ref.CLIP_L_TEXT, "text_encoder_2": ref.OPEN_CLIP_BIGG_TEXT}

# The model types this module declares, in the order the model-type menu lists them.
MODEL_TYPES: tuple[ModelTypeInfo, ...] = (
    ModelTypeInfo(
        ModelType.STABLE_DIFFUSION_XL_10_BASE,
        "SDXL 1.0",
        SDXL,
        1024,
        False,
        False,
        _SDXL_SAMPLE,
        released_parts={"unet": ref.SDXL_UNET, **_SDXL},
    ),
    ModelTypeInfo(
        ModelType.STABLE_DIFFUSION_XL_10_BASE_INPAINTING,
        "SDXL 1.0 Inpainting",
        SDXL,
        1024,
        False,
        True,
        _SDXL_SAMPLE,
        released_parts={"unet": ref.SDXL_INPAINTING_UNET, **_SDXL},
    ),
)
