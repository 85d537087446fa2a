"""Stable Diffusion 1.5 / 2.x: the UNet with one CLIP text encoder.

The declaration of `sd.py`'s families (torch-free: the config and the GUI read it through
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

SD = FamilyInfo(
    key="sd",
    label="Stable Diffusion 1.5 / 2.x",
    part_roles={"unet": PartRole.DENOISER, "text_encoder": PartRole.TEXT_ENCODER, "vae": PartRole.IMAGE_ENCODER},
    bucket_step=8,
    methods=ALL_METHODS,
    output_formats=SD_LIKE_FORMATS,
    muon_hidden_layers=("block", "encoder.layers"),
    layer_presets=UNET_LAYER_PRESETS,
    capabilities=SD_CAPABILITIES,
    part_capabilities={"vae": frozenset({OWN_MODEL})},
    notes="SD 2.0 depth (stabilityai/stable-diffusion-2-depth): the UNet takes each image's depth map as a fifth "
    "input channel, at latent size and scaled to [-1, 1] per image as StableDiffusionDepth2ImgPipeline does. It is "
    "the `<name>-depth.png` beside the image (greyscale, 8 or 16 bits, brighter = nearer; scaled, cropped, flipped "
    "and turned with the image, never trained as an image) where there is one, else the model folder's depth "
    "estimator's (its DPT-Hybrid from `depth_estimator/` and `feature_extractor/`, run in float32 once per image "
    "variation and cached with the latents). A depth model loads from a diffusers folder or hub id, not a single file "
    "(it lacks the estimator); a DIFFUSERS fine-tune is the depth pipeline's folder, estimator included, and LoRA "
    "files load with the pipeline's `load_lora_weights`. Samples are drawn from pure noise on the depth of the "
    "sample's base image (`base_image_path`; without one, a flat depth map).",
)


_SD1_SAMPLE = SampleDefaults(512, 512, 30, 7.5, NoiseScheduler.EULER_A)
_SD2_SAMPLE = SampleDefaults(768, 768, 30, 7.5, NoiseScheduler.DDIM)
_SD2_BASE_SAMPLE = SampleDefaults(512, 512, 30, 7.5, NoiseScheduler.DDIM)

# The released models' parts as their diffusers configs (what the estimate counts a hub model not yet downloaded as).
_SD1 = {"vae": ref.SD_VAE, "text_encoder": ref.CLIP_L_TEXT}
_SD2 = {"vae": ref.SD_VAE, "text_encoder": ref.OPEN_CLIP_H_TEXT}
# SD 2.0 depth's UNet: SD 2 base's with a fifth input channel, the depth map at latent size in [-1, 1].
SD2_DEPTH_UNET = {**ref.SD2_BASE_UNET, "in_channels": 5}

# The model types this module declares, in the order the model-type menu lists them.
MODEL_TYPES: tuple[ModelTypeInfo, ...] = (
    ModelTypeInfo(
        ModelType.STABLE_DIFFUSION_15,
        "SD 1.5",
        SD,
        512,
        False,
        False,
        _SD1_SAMPLE,
        released_parts={"unet": ref.SD15_UNET, **_SD1},
    ),
    ModelTypeInfo(
        ModelType.STABLE_DIFFUSION_15_INPAINTING,
        "SD 1.5 Inpainting",
        SD,
        512,
        False,
        True,
        _SD1_SAMPLE,
        released_parts={"unet": ref.SD15_INPAINTING_UNET, **_SD1},
    ),
    ModelTypeInfo(
        ModelType.STABLE_DIFFUSION_20_BASE,
        "SD 2.0 Base (512)",
        SD,
        512,
        False,
        False,
        _SD2_BASE_SAMPLE,
        released_parts={"unet": ref.SD2_BASE_UNET, **_SD2},
    ),
    ModelTypeInfo(
        ModelType.STABLE_DIFFUSION_20,
        "SD 2.0 (768, v-pred)",
        SD,
        768,
        True,
        False,
        _SD2_SAMPLE,
        released_parts={"unet": ref.SD2_768_UNET, **_SD2},
    ),
    ModelTypeInfo(
        ModelType.STABLE_DIFFUSION_20_INPAINTING,
        "SD 2.0 Inpainting",
        SD,
        512,
        False,
        True,
        _SD2_BASE_SAMPLE,
        released_parts={"unet": ref.SD2_INPAINTING_UNET, **_SD2},
    ),
    ModelTypeInfo(
        ModelType.STABLE_DIFFUSION_20_DEPTH,
        "SD 2.0 Depth",
        SD,
        512,
        False,
        False,
        _SD2_BASE_SAMPLE,
        released_parts={"unet": SD2_DEPTH_UNET, **_SD2},
        depth_input=True,
    ),
    ModelTypeInfo(
        ModelType.STABLE_DIFFUSION_21_BASE,
        "SD 2.1 Base (512)",
        SD,
        512,
        False,
        False,
        _SD2_BASE_SAMPLE,
        released_parts={"unet": ref.SD2_BASE_UNET, **_SD2},
    ),
    ModelTypeInfo(
        ModelType.STABLE_DIFFUSION_21,
        "SD 2.1 (768, v-pred)",
        SD,
        768,
        True,
        False,
        _SD2_SAMPLE,
        released_parts={"unet": ref.SD21_768_UNET, **_SD2},
    ),
)
