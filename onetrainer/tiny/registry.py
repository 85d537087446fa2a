"""The tiny model variants, by name, and the real models they imitate.

Listing the variants is cheap: diffusers is imported only when one is built.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from onetrainer.config.enums import ModelType
from onetrainer.tiny import reference as ref
from onetrainer.tiny.reference import Config

if TYPE_CHECKING:
    from diffusers import DiffusionPipeline

# Every variant samples at 64 px by default: 8x8 latents, small enough for a CPU and still divisible by every
# UNet's downsampling.
DEFAULT_RESOLUTION = 64
# Würstchen and Stable Cascade work at 1/42.67 (prior) and 1/4 (decoder) of the image size: 128 px gives a 3x3
# prior latent and a 32x32 decoder latent, the smallest sizes that pass cleanly through both.
CASCADE_RESOLUTION = 128


@dataclass(frozen=True)
class TinyVariant:
    """One tiny model: the real model it imitates and how to build it."""

    name: str
    model_type: ModelType
    pipeline_class: str  # the diffusers pipeline class, as in model_index.json
    description: str
    # Builder module under onetrainer.tiny, with `build_pipeline(variant, seed)`.
    family: str
    # Real (full-size) config of each pipeline component; the tiny ones differ only in width fields.
    references: Mapping[str, Config]
    resolution: int = DEFAULT_RESOLUTION
    # Block counts the tiny model shrinks, by component ({"transformer": {"num_layers": 2}}): only where the real
    # model repeats one block kind dozens of times (`reference.TINY_DEPTH_FIELDS`); every other variant keeps the
    # real depth.
    depths: Mapping[str, Config] = field(default_factory=dict)

    @property
    def prediction_type(self) -> str:
        # Würstchen's scheduler has no such setting: its models predict the noise.
        return self.references["scheduler"].get("prediction_type", "epsilon")

    def build(self, seed: int = 0) -> DiffusionPipeline:
        module = importlib.import_module(f"onetrainer.tiny.{self.family}")
        return module.build_pipeline(self, seed)


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


def _sdxl(unet: Config) -> dict[str, Config]:
    return {
        "unet": unet,
        "vae": ref.SDXL_VAE,
        "text_encoder": ref.CLIP_L_TEXT,
        "tokenizer": ref.CLIP_TOKENIZER,
        "text_encoder_2": ref.OPEN_CLIP_BIGG_TEXT,
        "tokenizer_2": ref.OPEN_CLIP_TOKENIZER,
        "scheduler": ref.EULER_EPSILON,
    }


def _flux(transformer: Config, scheduler: Config) -> dict[str, Config]:
    return {
        "transformer": transformer,
        "vae": ref.FLUX_VAE,
        "text_encoder": ref.CLIP_L_TEXT,
        "tokenizer": ref.CLIP_TOKENIZER,
        "text_encoder_2": ref.T5_XXL_ENCODER,
        "tokenizer_2": ref.T5_TOKENIZER,
        "scheduler": scheduler,
    }


def _sd3(transformer: Config) -> dict[str, Config]:
    return {
        "transformer": transformer,
        "vae": ref.SD3_VAE,
        "text_encoder": ref.CLIP_L_PROJECTED_TEXT,
        "tokenizer": ref.CLIP_TOKENIZER,
        "text_encoder_2": ref.CLIP_G_PROJECTED_TEXT,
        "tokenizer_2": ref.OPEN_CLIP_TOKENIZER,
        "text_encoder_3": ref.T5_XXL_ENCODER,
        "tokenizer_3": ref.T5_TOKENIZER,
        "scheduler": ref.FLOW_MATCH_EULER_SD3,
    }


# SD3's 24 (3.5 Large: 38) joint blocks as 2: the second is the last, whose text branch ends early (context_pre_only);
# 3.5 Medium's dual-attention blocks (its first 13) as the first.
SD3_DEPTH = {"transformer": {"num_layers": 2}}
SD35_MEDIUM_DEPTH = {"transformer": {"num_layers": 2, "dual_attention_layers": [0]}}

# Flux's and Chroma's 19 double-stream and 38 single-stream blocks as 2 of each: every key pattern, a fraction of the
# time.
FLUX_DEPTH = {"transformer": {"num_layers": 2, "num_single_layers": 2}}

# Z-Image's 30 main blocks as 2 (its 2 + 2 refiner blocks stay); Qwen3-4B's 36 decoder layers as 3: the pipeline
# reads the penultimate layer's output, so two layers feed the transformer and the last one's output goes unused, as in
# the real model.
Z_IMAGE_DEPTH = {"transformer": {"n_layers": 2}, "text_encoder": {"num_hidden_layers": 3}}

# Qwen-Image's 60 dual-stream blocks as 2; Qwen2.5-VL's 28 decoder layers as 3 (the pipelines read the last layer's
# normed output) and its vision tower's 32 blocks as 2: a windowed one and the full-attention one that ends each group
# of eight in the real tower.
QWEN_IMAGE_DEPTH = {
    "transformer": {"num_layers": 2},
    "text_encoder": {"num_hidden_layers": 3, "vision_config": {"depth": 2, "fullatt_block_indexes": [1]}},
}


def _qwen_image(**extra: Config) -> dict[str, Config]:
    return {
        "transformer": ref.QWEN_IMAGE_TRANSFORMER,
        "vae": ref.QWEN_IMAGE_VAE,
        "text_encoder": ref.QWEN25_VL_7B_TEXT,
        "tokenizer": ref.QWEN25_VL_TOKENIZER,
        "scheduler": ref.QWEN_IMAGE_SCHEDULER,
        **extra,
    }


TINY_VARIANTS: dict[str, TinyVariant] = {
    "sd15": TinyVariant(
        name="sd15",
        model_type=ModelType.STABLE_DIFFUSION_15,
        pipeline_class="StableDiffusionPipeline",
        description="Stable Diffusion 1.5: CLIP-L text encoder (12 layers), PNDM, epsilon prediction",
        family="sd",
        references=_sd1(ref.SD15_UNET, ref.PNDM_EPSILON),
    ),
    "sd15-inpainting": TinyVariant(
        name="sd15-inpainting",
        model_type=ModelType.STABLE_DIFFUSION_15_INPAINTING,
        pipeline_class="StableDiffusionInpaintPipeline",
        description="Stable Diffusion 1.5 inpainting: sd15 with a 9-channel UNet input (latent, masked latent, mask)",
        family="sd",
        references=_sd1(ref.SD15_INPAINTING_UNET, ref.DDIM_EPSILON),
    ),
    "sd20-base": TinyVariant(
        name="sd20-base",
        model_type=ModelType.STABLE_DIFFUSION_20_BASE,
        pipeline_class="StableDiffusionPipeline",
        description="Stable Diffusion 2.0 base (512 px): OpenCLIP-H text encoder (23 layers), linear projections, "
        "per-block head counts, epsilon prediction",
        family="sd",
        references=_sd2(ref.SD2_BASE_UNET, ref.PNDM_EPSILON),
    ),
    "sd20": TinyVariant(
        name="sd20",
        model_type=ModelType.STABLE_DIFFUSION_20,
        pipeline_class="StableDiffusionPipeline",
        description="Stable Diffusion 2.0 (768 px): the SD 2 topology with v-prediction",
        family="sd",
        references=_sd2(ref.SD2_768_UNET, ref.DDIM_V_PREDICTION),
    ),
    "sd20-inpainting": TinyVariant(
        name="sd20-inpainting",
        model_type=ModelType.STABLE_DIFFUSION_20_INPAINTING,
        pipeline_class="StableDiffusionInpaintPipeline",
        description="Stable Diffusion 2.0 inpainting: sd20-base with a 9-channel UNet input",
        family="sd",
        references=_sd2(ref.SD2_INPAINTING_UNET, ref.PNDM_EPSILON),
    ),
    "sd21-base": TinyVariant(
        name="sd21-base",
        model_type=ModelType.STABLE_DIFFUSION_21_BASE,
        pipeline_class="StableDiffusionPipeline",
        description="Stable Diffusion 2.1 base (512 px): the SD 2 topology, epsilon prediction",
        family="sd",
        references=_sd2(ref.SD2_BASE_UNET, ref.PNDM_EPSILON),
    ),
    "sd21": TinyVariant(
        name="sd21",
        model_type=ModelType.STABLE_DIFFUSION_21,
        pipeline_class="StableDiffusionPipeline",
        description="Stable Diffusion 2.1 (768 px): the SD 2 topology, v-prediction, attention upcast to fp32",
        family="sd",
        references=_sd2(ref.SD21_768_UNET, ref.DDIM_V_PREDICTION),
    ),
    "sdxl": TinyVariant(
        name="sdxl",
        model_type=ModelType.STABLE_DIFFUSION_XL_10_BASE,
        pipeline_class="StableDiffusionXLPipeline",
        description="SDXL 1.0 base: CLIP-L (12 layers) + OpenCLIP-bigG with projection (32 layers), transformer "
        "depths 1/2/10, text_time added embeddings, Euler, epsilon prediction",
        family="sdxl",
        references=_sdxl(ref.SDXL_UNET),
    ),
    "sdxl-inpainting": TinyVariant(
        name="sdxl-inpainting",
        model_type=ModelType.STABLE_DIFFUSION_XL_10_BASE_INPAINTING,
        pipeline_class="StableDiffusionXLInpaintPipeline",
        description="SDXL 1.0 inpainting: sdxl with a 9-channel UNet input",
        family="sdxl",
        references=_sdxl(ref.SDXL_INPAINTING_UNET),
    ),
    "pixart": TinyVariant(
        name="pixart",
        model_type=ModelType.PIXART_ALPHA,
        pipeline_class="PixArtAlphaPipeline",
        description="PixArt-alpha XL-2 1024-MS: 28-layer DiT with resolution micro-conditioning (sample_size stays "
        "128: pass height/width and use_resolution_binning=False), T5 v1.1 XXL encoder (24 layers), DPM-Solver++",
        family="pixart",
        references={
            "transformer": ref.PIXART_ALPHA_TRANSFORMER,
            "vae": ref.SD_VAE,
            "text_encoder": ref.T5_XXL_ENCODER,
            "tokenizer": ref.T5_TOKENIZER,
            "scheduler": ref.DPM_SOLVER_PIXART,
        },
    ),
    "flux-dev": TinyVariant(
        name="flux-dev",
        model_type=ModelType.FLUX_DEV_1,
        pipeline_class="FluxPipeline",
        description="FLUX.1-dev: double- and single-stream transformer blocks (2 + 2 of the real 19 + 38) with a "
        "guidance embedding, CLIP-L (12 layers, pooled) + T5 v1.1 XXL (24 layers), 16-channel VAE, flow-matching "
        "Euler with a resolution-dependent shift",
        family="flux",
        references=_flux(ref.FLUX_DEV_TRANSFORMER, ref.FLOW_MATCH_EULER_DYNAMIC),
        depths=FLUX_DEPTH,
    ),
    "flux-schnell": TinyVariant(
        name="flux-schnell",
        model_type=ModelType.FLUX_DEV_1,
        pipeline_class="FluxPipeline",
        description="FLUX.1-schnell: flux-dev without the guidance embedding, flow-matching Euler without shift "
        "(samples in ~4 steps, T5 prompts of 256 tokens)",
        family="flux",
        references=_flux(ref.FLUX_SCHNELL_TRANSFORMER, ref.FLOW_MATCH_EULER_SCHNELL),
        depths=FLUX_DEPTH,
    ),
    "flux-fill": TinyVariant(
        name="flux-fill",
        model_type=ModelType.FLUX_FILL_DEV_1,
        pipeline_class="FluxFillPipeline",
        description="FLUX.1-Fill-dev: flux-dev taking the masked image's latents and the packed 8x8-pixel mask "
        "beside the noisy latents (384 input channels at full size)",
        family="flux",
        references=_flux(ref.FLUX_FILL_TRANSFORMER, ref.FLOW_MATCH_EULER_DYNAMIC),
        depths=FLUX_DEPTH,
    ),
    "chroma": TinyVariant(
        name="chroma",
        model_type=ModelType.CHROMA_1,
        pipeline_class="ChromaPipeline",
        description="Chroma1-HD: Flux's blocks (2 + 2 of 19 + 38) modulated by an approximator network, T5 v1.1 XXL "
        "alone with its attention mask, 16-channel VAE, flow-matching Euler; real CFG with negative prompts",
        family="flux",
        references={
            "transformer": ref.CHROMA_TRANSFORMER,
            "vae": ref.FLUX_VAE,
            "text_encoder": ref.T5_XXL_ENCODER,
            "tokenizer": ref.T5_TOKENIZER,
            "scheduler": ref.FLOW_MATCH_EULER_DYNAMIC,
        },
        depths=FLUX_DEPTH,
    ),
    "sd3": TinyVariant(
        name="sd3",
        model_type=ModelType.STABLE_DIFFUSION_3,
        pipeline_class="StableDiffusion3Pipeline",
        description="Stable Diffusion 3 Medium: joint (MMDiT) blocks (2 of the real 24), CLIP-L and CLIP-G with "
        "projections + T5 v1.1 XXL (24 layers), 16-channel VAE, flow-matching Euler at shift 3",
        family="sd3",
        references=_sd3(ref.SD3_MEDIUM_TRANSFORMER),
        depths=SD3_DEPTH,
    ),
    "sd35-medium": TinyVariant(
        name="sd35-medium",
        model_type=ModelType.STABLE_DIFFUSION_35,
        pipeline_class="StableDiffusion3Pipeline",
        description="Stable Diffusion 3.5 Medium (MMDiT-X): sd3 with qk-norm and a second image self-attention in "
        "its first blocks",
        family="sd3",
        references=_sd3(ref.SD35_MEDIUM_TRANSFORMER),
        depths=SD35_MEDIUM_DEPTH,
    ),
    "sd35-large": TinyVariant(
        name="sd35-large",
        model_type=ModelType.STABLE_DIFFUSION_35,
        pipeline_class="StableDiffusion3Pipeline",
        description="Stable Diffusion 3.5 Large: sd3's blocks (2 of the real 38) with qk-norm",
        family="sd3",
        references=_sd3(ref.SD35_LARGE_TRANSFORMER),
        depths=SD3_DEPTH,
    ),
    "z-image": TinyVariant(
        name="z-image",
        model_type=ModelType.Z_IMAGE,
        pipeline_class="ZImagePipeline",
        description="Z-Image (Tongyi-MAI/Z-Image): single-stream DiT blocks (2 of the real 30, after 2 + 2 refiner "
        "blocks for the image and the text) with 3D rotary positions, Qwen3-4B text encoder (3 of 36 layers, its "
        "penultimate hidden states, prompts in Qwen3's chat template), 16-channel Flux VAE, flow-matching Euler at "
        "shift 6",
        family="zimage",
        references={
            "transformer": ref.Z_IMAGE_TRANSFORMER,
            "vae": ref.Z_IMAGE_VAE,
            "text_encoder": ref.QWEN3_4B_TEXT,
            "tokenizer": ref.QWEN3_TOKENIZER,
            "scheduler": ref.Z_IMAGE_SCHEDULER,
        },
        depths=Z_IMAGE_DEPTH,
    ),
    "qwen-image": TinyVariant(
        name="qwen-image",
        model_type=ModelType.QWEN,
        pipeline_class="QwenImagePipeline",
        description="Qwen-Image (Qwen/Qwen-Image): dual-stream MMDiT blocks (2 of the real 60) with 3D rotary "
        "positions, Qwen2.5-VL-7B text encoder (3 of 28 decoder layers, its last hidden states after a fixed system "
        "prompt; vision tower 2 of 32 blocks), Wan's 16-channel video VAE on single frames, flow-matching Euler with "
        "an exponential resolution-dependent shift; real CFG with negative prompts",
        family="qwen",
        references=_qwen_image(),
        depths=QWEN_IMAGE_DEPTH,
    ),
    "qwen-image-edit": TinyVariant(
        name="qwen-image-edit",
        model_type=ModelType.QWEN_EDIT,
        pipeline_class="QwenImageEditPlusPipeline",
        description="Qwen-Image-Edit-2509 (Qwen/Qwen-Image-Edit-2509): qwen-image conditioned on reference images, "
        "seen by Qwen2.5-VL's vision tower beside the instruction and appended to the transformer's sequence as VAE "
        "latents; a Qwen2VLProcessor (load it with `onetrainer.families.qwen_processor.load_processor`: transformers "
        "builds the hub class only with torchvision)",
        family="qwen",
        references=_qwen_image(processor=ref.QWEN2VL_IMAGE_PROCESSOR),
        depths=QWEN_IMAGE_DEPTH,
    ),
    "wuerstchen": TinyVariant(
        name="wuerstchen",
        model_type=ModelType.WUERSTCHEN_2,
        pipeline_class="WuerstchenPriorPipeline",
        description="Würstchen v2 prior (stage C, like warp-ai/wuerstchen-prior): 32 blocks, OpenCLIP-bigG text "
        "encoder (32 layers); its decoder is wuerstchen-decoder",
        family="wuerstchen",
        references={
            "prior": ref.WUERSTCHEN_PRIOR,
            "text_encoder": ref.LAION_BIGG_TEXT,
            "tokenizer": ref.OPEN_CLIP_TOKENIZER,
            "scheduler": ref.DDPM_WUERSTCHEN,
        },
        resolution=CASCADE_RESOLUTION,
    ),
    "wuerstchen-decoder": TinyVariant(
        name="wuerstchen-decoder",
        model_type=ModelType.WUERSTCHEN_2,
        pipeline_class="WuerstchenDecoderPipeline",
        description="Würstchen v2 decoder (stages B and A, like warp-ai/wuerstchen): DiffNeXt blocks 4/4/14/4, "
        "OpenCLIP-H text encoder (24 layers), Paella VQGAN",
        family="wuerstchen",
        references={
            "decoder": ref.WUERSTCHEN_DECODER,
            "vqgan": ref.PAELLA_VQGAN,
            "text_encoder": ref.LAION_H_TEXT,
            "tokenizer": ref.OPEN_CLIP_TOKENIZER,
            "scheduler": ref.DDPM_WUERSTCHEN,
        },
        resolution=CASCADE_RESOLUTION,
    ),
    "cascade": TinyVariant(
        name="cascade",
        model_type=ModelType.STABLE_CASCADE_1,
        pipeline_class="StableCascadePriorPipeline",
        description="Stable Cascade prior (stage C, like stabilityai/stable-cascade-prior): 8+24 blocks, "
        "OpenCLIP-bigG with projection (32 layers), CLIP-L image encoder; its decoder is cascade-decoder",
        family="cascade",
        references={
            "prior": ref.CASCADE_PRIOR_UNET,
            "text_encoder": ref.OPEN_CLIP_BIGG_TEXT,
            "tokenizer": ref.OPEN_CLIP_TOKENIZER,
            "image_encoder": ref.CLIP_L_VISION,
            "scheduler": ref.DDPM_WUERSTCHEN,
        },
        resolution=CASCADE_RESOLUTION,
    ),
    "cascade-decoder": TinyVariant(
        name="cascade-decoder",
        model_type=ModelType.STABLE_CASCADE_1,
        pipeline_class="StableCascadeDecoderPipeline",
        description="Stable Cascade decoder (stages B and A, like stabilityai/stable-cascade): blocks 2/6/28/6, "
        "OpenCLIP-bigG with projection (32 layers), Paella VQGAN",
        family="cascade",
        references={
            "decoder": ref.CASCADE_DECODER_UNET,
            "vqgan": ref.PAELLA_VQGAN,
            "text_encoder": ref.OPEN_CLIP_BIGG_TEXT,
            "tokenizer": ref.OPEN_CLIP_TOKENIZER,
            "scheduler": ref.DDPM_WUERSTCHEN,
        },
        resolution=CASCADE_RESOLUTION,
    ),
}
