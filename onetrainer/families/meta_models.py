"""Models built from their configs alone, on the meta device when asked (shapes and dtypes, no memory, no weights):
the released full-size parts of each model type and the class a config names.

The estimate (`training/estimate.py`) builds the model to be trained this way to count and measure it without
loading it, and the tiny test models (`onetrainer/tiny/`) instantiate their configs with the same calls.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

from onetrainer.families import reference_configs as ref
from onetrainer.families.reference_configs import Config


def init_kwargs(config: Config) -> Config:
    """A diffusers config without its bookkeeping entries (`_class_name`, ...), ready for the class's __init__."""
    return {k: v for k, v in config.items() if not k.startswith("_")}


def model_class(config: Config) -> type[torch.nn.Module]:
    """The class a config describes: `_module` + `_class_name` for our own modules, `_class_name` for diffusers,
    `architectures` for transformers."""
    if "_module" in config:
        return getattr(importlib.import_module(config["_module"]), config["_class_name"])
    from onetrainer.util.threads import library_attribute

    if "_class_name" in config:
        name = config["_class_name"]
        try:
            return library_attribute("diffusers", name)
        except AttributeError:  # Würstchen's models live among diffusers' deprecated pipelines
            return library_attribute("diffusers.pipelines.deprecated.wuerstchen", name)
    return library_attribute("transformers", config["architectures"][0])


def instantiate(config: Config) -> torch.nn.Module:
    """A model with freshly initialised weights from a config dict (under `torch.device("meta")`, without any)."""
    cls = model_class(config)
    if "_class_name" in config and "architectures" not in config:
        return cls(**init_kwargs(config))
    return cls(cls.config_class(**config))


def is_model_config(config: Any) -> bool:
    """Whether a dict describes a model (not a tokenizer's or a scheduler's)."""
    return (
        isinstance(config, dict)
        and ("architectures" in config or "_class_name" in config)
        and not (str(config.get("_class_name", "")).endswith("Scheduler"))
    )


# The EfficientNet encoders of Würstchen (affine mapper norm) and Stable Cascade: no config file of their own.
_EFFNET = {"_module": "onetrainer.families.effnet", "_class_name": "EfficientNetEncoder"}
_SD1 = {"vae": ref.SD_VAE, "text_encoder": ref.CLIP_L_TEXT}
_SD2 = {"vae": ref.SD_VAE, "text_encoder": ref.OPEN_CLIP_H_TEXT}
_SDXL = {"vae": ref.SDXL_VAE, "text_encoder": ref.CLIP_L_TEXT, "text_encoder_2": ref.OPEN_CLIP_BIGG_TEXT}
_SD3 = {
    "text_encoder": ref.CLIP_L_PROJECTED_TEXT,
    "text_encoder_2": ref.CLIP_G_PROJECTED_TEXT,
    "text_encoder_3": ref.T5_XXL_ENCODER,
    "vae": ref.SD3_VAE,
}

# The released full-size model of each model type, part by part (the parts' names are their families'): what a hub
# model that is not downloaded yet is counted as.
RELEASED_PARTS: dict[str, dict[str, Config]] = {
    "STABLE_DIFFUSION_15": {"unet": ref.SD15_UNET, **_SD1},
    "STABLE_DIFFUSION_15_INPAINTING": {"unet": ref.SD15_INPAINTING_UNET, **_SD1},
    "STABLE_DIFFUSION_20_BASE": {"unet": ref.SD2_BASE_UNET, **_SD2},
    "STABLE_DIFFUSION_20": {"unet": ref.SD2_768_UNET, **_SD2},
    "STABLE_DIFFUSION_20_INPAINTING": {"unet": ref.SD2_INPAINTING_UNET, **_SD2},
    "STABLE_DIFFUSION_21_BASE": {"unet": ref.SD2_BASE_UNET, **_SD2},
    "STABLE_DIFFUSION_21": {"unet": ref.SD21_768_UNET, **_SD2},
    "STABLE_DIFFUSION_XL_10_BASE": {"unet": ref.SDXL_UNET, **_SDXL},
    "STABLE_DIFFUSION_XL_10_BASE_INPAINTING": {"unet": ref.SDXL_INPAINTING_UNET, **_SDXL},
    "PIXART_ALPHA": {
        "transformer": ref.PIXART_ALPHA_TRANSFORMER,
        "text_encoder": ref.T5_XXL_ENCODER,
        "vae": ref.SD_VAE,
    },
    "STABLE_DIFFUSION_3": {"transformer": ref.SD3_MEDIUM_TRANSFORMER, **_SD3},
    # SD 3.5: Large unless the name says Medium (`RELEASED_VARIANTS`)
    "STABLE_DIFFUSION_35": {"transformer": ref.SD35_LARGE_TRANSFORMER, **_SD3},
    "FLUX_DEV_1": {
        "transformer": ref.FLUX_DEV_TRANSFORMER,
        "text_encoder": ref.CLIP_L_TEXT,
        "text_encoder_2": ref.T5_XXL_ENCODER,
        "vae": ref.FLUX_VAE,
    },
    "FLUX_FILL_DEV_1": {
        "transformer": ref.FLUX_FILL_TRANSFORMER,
        "text_encoder": ref.CLIP_L_TEXT,
        "text_encoder_2": ref.T5_XXL_ENCODER,
        "vae": ref.FLUX_VAE,
    },
    "CHROMA_1": {"transformer": ref.CHROMA_TRANSFORMER, "text_encoder": ref.T5_XXL_ENCODER, "vae": ref.FLUX_VAE},
    "QWEN": {
        "transformer": ref.QWEN_IMAGE_TRANSFORMER,
        "text_encoder": ref.QWEN25_VL_7B_TEXT,
        "vae": ref.QWEN_IMAGE_VAE,
    },
    "QWEN_EDIT": {
        "transformer": ref.QWEN_IMAGE_TRANSFORMER,
        "text_encoder": ref.QWEN25_VL_7B_TEXT,
        "vae": ref.QWEN_IMAGE_VAE,
    },
    "Z_IMAGE": {"transformer": ref.Z_IMAGE_TRANSFORMER, "text_encoder": ref.QWEN3_4B_TEXT, "vae": ref.Z_IMAGE_VAE},
    "WUERSTCHEN_2": {
        "prior": ref.WUERSTCHEN_PRIOR,
        "text_encoder": ref.LAION_BIGG_TEXT,
        "decoder": ref.WUERSTCHEN_DECODER,
        "decoder_text_encoder": ref.LAION_H_TEXT,
        "decoder_vqgan": ref.PAELLA_VQGAN,
        "effnet_encoder": {**_EFFNET, "affine": True},
    },
    "STABLE_CASCADE_1": {
        "prior": ref.CASCADE_PRIOR_UNET,
        "text_encoder": ref.OPEN_CLIP_BIGG_TEXT,
        "decoder": ref.CASCADE_DECODER_UNET,
        "decoder_vqgan": ref.PAELLA_VQGAN,
        "effnet_encoder": {**_EFFNET, "affine": False},
    },
}


# Model types whose released models differ in size, {model type: ((a word of the base model's name, the parts that
# differ), …)}: a hub id not downloaded yet is counted as the one its name says.
RELEASED_VARIANTS: dict[str, tuple[tuple[str, dict[str, Config]], ...]] = {
    "STABLE_DIFFUSION_35": (("medium", {"transformer": ref.SD35_MEDIUM_TRANSFORMER}),),
}


def released_parts(model_type: Any, base_model_name: str = "") -> dict[str, Config]:
    """The full-size configs of a model type's parts (the variant `base_model_name` names, where its type has
    several); ValueError for a type without a reference model."""
    key = getattr(model_type, "value", model_type)
    if key not in RELEASED_PARTS:
        raise ValueError(f"no reference model for {key}")
    name = base_model_name.lower()
    for word, parts in RELEASED_VARIANTS.get(key, ()):
        if word in name:
            return {**RELEASED_PARTS[key], **parts}
    return RELEASED_PARTS[key]
