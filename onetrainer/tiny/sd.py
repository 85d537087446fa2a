"""Tiny Stable Diffusion 1.x and 2.x pipelines, text-to-image and inpainting."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from onetrainer.config.enums import ModelType
from onetrainer.families.sd_info import SD2_DEPTH_UNET
from onetrainer.tiny import reference as ref
from onetrainer.tiny.variant import TinyVariant

if TYPE_CHECKING:
    from diffusers import StableDiffusionPipeline

    from onetrainer.tiny.reference import Config

LISTING_ORDER = 1


def _sd1(unet: Config, scheduler: Config) -> dict[str, Config]:
    return {
        "unet": unet,
        "vae": ref.SD_VAE,
        "text_encoder": ref.CLIP_L_TEXT,
        "tokenizer": ref.CLIP_TOKENIZER,
        "scheduler": scheduler,
    }


def _sd2(unet: Config, scheduler: Config) -> dict[str, Config]:
    return {
        "unet": unet,
        "vae": ref.SD_VAE,
        "text_encoder": ref.OPEN_CLIP_H_TEXT,
        "tokenizer": ref.OPEN_CLIP_TOKENIZER,
        "scheduler": scheduler,
    }


VARIANTS = (
    TinyVariant(
        name="sd15",
        model_type=ModelType.STABLE_DIFFUSION_15,
        pipeline_class="StableDiffusionPipeline",
        description="Stable Diffusion 1.5: CLIP-L text encoder (12 layers), PNDM, epsilon prediction",
        module=__name__,
        references=_sd1(ref.SD15_UNET, ref.PNDM_EPSILON),
    ),
    TinyVariant(
        name="sd15-inpainting",
        model_type=ModelType.STABLE_DIFFUSION_15_INPAINTING,
        pipeline_class="StableDiffusionInpaintPipeline",
        description="Stable Diffusion 1.5 inpainting: sd15 with a 9-channel UNet input (latent, masked latent, mask)",
        module=__name__,
        references=_sd1(ref.SD15_INPAINTING_UNET, ref.DDIM_EPSILON),
    ),
    TinyVariant(
        name="sd20-base",
        model_type=ModelType.STABLE_DIFFUSION_20_BASE,
        pipeline_class="StableDiffusionPipeline",
        description="Stable Diffusion 2.0 base (512 px): OpenCLIP-H text encoder (23 layers), linear projections, "
        "per-block head counts, epsilon prediction",
        module=__name__,
        references=_sd2(ref.SD2_BASE_UNET, ref.PNDM_EPSILON),
    ),
    TinyVariant(
        name="sd20",
        model_type=ModelType.STABLE_DIFFUSION_20,
        pipeline_class="StableDiffusionPipeline",
        description="Stable Diffusion 2.0 (768 px): the SD 2 topology with v-prediction",
        module=__name__,
        references=_sd2(ref.SD2_768_UNET, ref.DDIM_V_PREDICTION),
    ),
    TinyVariant(
        name="sd20-inpainting",
        model_type=ModelType.STABLE_DIFFUSION_20_INPAINTING,
        pipeline_class="StableDiffusionInpaintPipeline",
        description="Stable Diffusion 2.0 inpainting: sd20-base with a 9-channel UNet input",
        module=__name__,
        references=_sd2(ref.SD2_INPAINTING_UNET, ref.PNDM_EPSILON),
    ),
    TinyVariant(
        name="sd20-depth",
        model_type=ModelType.STABLE_DIFFUSION_20_DEPTH,
        pipeline_class="StableDiffusionDepth2ImgPipeline",
        description="Stable Diffusion 2.0 depth: sd20-base with a 5-channel UNet input (latent, depth map) and a "
        "tiny random DPT depth estimator (a plain ViT DPT standing in for DPT-Hybrid) with its image processor",
        module=__name__,
        references=_sd2(SD2_DEPTH_UNET, ref.PNDM_EPSILON),
    ),
    TinyVariant(
        name="sd21-base",
        model_type=ModelType.STABLE_DIFFUSION_21_BASE,
        pipeline_class="StableDiffusionPipeline",
        description="Stable Diffusion 2.1 base (512 px): the SD 2 topology, epsilon prediction",
        module=__name__,
        references=_sd2(ref.SD2_BASE_UNET, ref.PNDM_EPSILON),
    ),
    TinyVariant(
        name="sd21",
        model_type=ModelType.STABLE_DIFFUSION_21,
        pipeline_class="StableDiffusionPipeline",
        description="Stable Diffusion 2.1 (768 px): the SD 2 topology, v-prediction, attention upcast to fp32",
        module=__name__,
        references=_sd2(ref.SD21_768_UNET, ref.DDIM_V_PREDICTION),
    ),
)


def build_pipeline(variant: TinyVariant, seed: int) -> StableDiffusionPipeline:
    """The pipeline for `variant`, whose references name the real unet, vae, text_encoder, tokenizer, scheduler."""
    from onetrainer.tiny import components
    from onetrainer.util.threads import library_attribute

    refs = variant.references
    tokenizer, text_encoder = components.build_clip_text(refs, seed)
    vae_config = components.tiny_vae_config(refs["vae"], variant.resolution)
    unet_config = components.tiny_unet_config(
        refs["unet"],
        cross_attention_dim=text_encoder.config.hidden_size,
        sample_size=components.latent_size(vae_config, variant.resolution),
    )
    pipeline_class = library_attribute("diffusers", variant.pipeline_class)
    parts = {
        "vae": components.build_vae(vae_config, seed),
        "text_encoder": text_encoder,
        "tokenizer": tokenizer,
        "unet": components.build_unet(unet_config, seed),
        "scheduler": components.build_scheduler(refs["scheduler"]),
    }
    if variant.pipeline_class == "StableDiffusionDepth2ImgPipeline":
        return pipeline_class(**parts, **_tiny_depth_estimator(seed, variant.resolution))
    # StableDiffusionPipeline or StableDiffusionInpaintPipeline: they take the same parts.
    return pipeline_class(**parts, safety_checker=None, feature_extractor=None, requires_safety_checker=False)


def _tiny_depth_estimator(seed: int, resolution: int) -> dict[str, Any]:
    """A tiny random DPT (4 ViT layers of width 32 on 8 px patches) and its image processor at the tiny resolution
    (the real one resizes to 384 px and normalises to [-1, 1]: mean and std 0.5)."""
    from transformers import DPTConfig, DPTForDepthEstimation, DPTImageProcessor

    from onetrainer.tiny.components import seeded

    config = DPTConfig(
        image_size=resolution,
        patch_size=8,
        hidden_size=32,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=37,
        backbone_out_indices=(0, 1, 2, 3),
        neck_hidden_sizes=[16, 32, 32, 32],
        fusion_hidden_size=32,
        head_hidden_size=16,
    )
    with seeded(seed, "depth_estimator"):
        estimator = DPTForDepthEstimation(config).eval()
    size = {"height": resolution, "width": resolution}
    processor = DPTImageProcessor(size=size, image_mean=[0.5] * 3, image_std=[0.5] * 3)
    return {"depth_estimator": estimator, "feature_extractor": processor}


def unet_inputs(model: Any, randn: Any) -> dict[str, Any]:
    from onetrainer.tiny.components import unet_inputs

    return unet_inputs(model, randn)


DENOISER_INPUTS = {"UNet2DConditionModel": unet_inputs}
