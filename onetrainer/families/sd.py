"""Stable Diffusion 1.5 and 2.x (512 epsilon, 768 v-prediction, inpainting): one UNet, one CLIP text encoder, a VAE."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from onetrainer.config.enums import ModelType
from onetrainer.config.model_types import model_type_info
from onetrainer.families import reference_configs as reference
from onetrainer.families.base import (
    BatchInputs,
    Conditioning,
    FamilyState,
    LoadedModel,
    TextEncoderSlot,
    first_weight,
)
from onetrainer.families.depth import DEPTH_EXTRA, depth_input, depth_maps, depth_sample_inputs
from onetrainer.families.inpainting import inpainting_inputs
from onetrainer.families.loading import (
    KeptParts,
    ModelLoadError,
    assign_weights,
    check_inpainting,
    empty_module,
    hub_options,
    load_diffusers_component,
    load_dtype,
    load_tokenizer,
    read_dtypes,
)
from onetrainer.families.saving import cast_state, plain_state
from onetrainer.families.schedules import discrete_schedule
from onetrainer.families.sd_common import (
    CONFIGS_KEY,
    TEXT_PREFIX,
    UNET_PREFIX,
    StableDiffusionBase,
    clip_config,
    convert_text_encoder,
    schedule_markers,
    single_file_tokenizer,
    wants_v_prediction,
)
from onetrainer.families.sd_info import SD
from onetrainer.families.sources import ModelSource
from onetrainer.families.vae import VAE_PREFIX, convert_vae, load_vae_override
from onetrainer.noise.prediction import Prediction
from onetrainer.weights import ldm_keys
from onetrainer.weights.checkpoint_files import load_state_dict, read_safetensors_metadata
from onetrainer.weights.clip_names import with_text_model
from onetrainer.weights.metadata import KINDS, ModelKind

if TYPE_CHECKING:
    from onetrainer.config import TrainConfig

log = logging.getLogger(__name__)


# SD 2's OpenCLIP-H layer after the penultimate one the model conditions on: not in the text encoder, kept for saving.
UNUSED_TEXT_LAYER = TEXT_PREFIX + "model.transformer.resblocks.23."


def is_sd2(model_type: ModelType) -> bool:
    return model_type.value.startswith("STABLE_DIFFUSION_2")


@dataclass(slots=True)
class SDState(FamilyState):
    """What an SD model keeps besides its parts: an SD 2 single file's unused last text-encoder layer
    (`UNUSED_TEXT_LAYER` keys, as the file has them), written back into the single file it saves."""

    kept: dict[str, torch.Tensor] = field(default_factory=dict)
    # SD 2.0 depth: the depth estimator (DPTForDepthEstimation) and its image processor, from the model folder's
    # `depth_estimator/` and `feature_extractor/`; no part (nothing trains it), used to cache each image's depth map
    # and for samples.
    depth_estimator: Any = None
    depth_processor: Any = None


class StableDiffusionFamily(StableDiffusionBase):
    info = SD
    saved_scheduler = "DDIMScheduler"  # the sampler a saved diffusers folder names (what the model's authors ship)
    sampling_parts = frozenset(SD.parts)

    # -- loading --------------------------------------------------------------------------------------------------

    def load(self, config: TrainConfig) -> LoadedModel:
        model_type = config.model_type
        parts = KeptParts(config)
        tokenizer, scheduler_config, state = self.read_source(config, parts)
        _check_model_type(parts["unet"].config, model_type, config.base_model_name)
        if config.vae.model_name:
            parts["vae"] = load_vae_override(config, parts["vae"].config)
        v_prediction = wants_v_prediction(config, model_type)
        slot = TextEncoderSlot(
            "text_encoder", parts["text_encoder"], tokenizer, "lora_te", "emb_params", config.text_encoder.layer_skip
        )
        zero_terminal_snr = config.rescale_noise_scheduler_to_zero_terminal_snr
        schedule = discrete_schedule(scheduler_config, v_prediction, zero_terminal_snr)
        return LoadedModel(model_type, parts, [slot], schedule, config.base_model_name, state)

    def load_diffusers(self, source: ModelSource, config: TrainConfig, parts: KeptParts):
        from diffusers import AutoencoderKL, DDPMScheduler, UNet2DConditionModel
        from transformers import CLIPTextModel

        options = hub_options(source, config)
        where = source.location
        for part, cls in (("unet", UNet2DConditionModel), ("text_encoder", CLIPTextModel), ("vae", AutoencoderKL)):
            parts[part] = load_diffusers_component(cls, where, part, options, dtype=load_dtype(config, part))
        tokenizer = load_tokenizer(where, options)
        scheduler_config = load_diffusers_component(DDPMScheduler, where, "scheduler", options, config_only=True)
        state = SDState()
        if model_type_info(config.model_type).depth_input:
            _check_model_type(parts["unet"].config, config.model_type, config.base_model_name)  # before the estimator
            state.depth_estimator, state.depth_processor = _load_depth_estimator(where, options)
        return tokenizer, scheduler_config, state

    def load_single_file(self, path: Path, config: TrainConfig):
        from diffusers import AutoencoderKL, UNet2DConditionModel
        from diffusers.loaders.single_file_utils import convert_ldm_unet_checkpoint
        from transformers import CLIPTextConfig, CLIPTextModel

        model_type = config.model_type
        if model_type_info(model_type).depth_input:
            raise ModelLoadError(
                f"{path}: {model_type.value} loads from a diffusers folder or hub id (a single file lacks its depth "
                "estimator)"
            )
        # SD 2's last text encoder layer, which the model does not use, is kept as the file has it, for saving.
        owners = {UNET_PREFIX: "unet", VAE_PREFIX: "vae", TEXT_PREFIX: "text_encoder", UNUSED_TEXT_LAYER: None}
        state = load_state_dict(path, read_dtypes(config, owners))
        metadata = read_safetensors_metadata(path) if path.suffix.lower() == ".safetensors" else {}
        detected = _detect_checkpoint(state, path)
        expected_v2 = is_sd2(model_type)
        if detected["v2"] != expected_v2:
            kind = "SD 2.x" if detected["v2"] else "SD 1.x"
            raise ModelLoadError(
                f"{path} is an {kind} checkpoint, which does not fit the model type {model_type.value}"
            )
        check_inpainting(detected["inpainting"], model_type, path, "checkpoint")

        configs = json.loads(metadata[CONFIGS_KEY]) if CONFIGS_KEY in metadata else _reference_configs(model_type)
        kept = {k: v for k, v in state.items() if k.startswith(UNUSED_TEXT_LAYER)}

        # Built in float32 and the file's tensors copied in before: the weights as that copy and the cast left them.
        def assign(part: str, module: torch.nn.Module, weights: dict, what: str) -> torch.nn.Module:
            return assign_weights(module, weights, load_dtype(config, part), f"{what} of {path}", torch.float32)

        unet = empty_module(lambda: UNet2DConditionModel.from_config(configs["unet"]))
        assign("unet", unet, convert_ldm_unet_checkpoint(state, unet.config), "the UNet")
        vae = empty_module(lambda: AutoencoderKL.from_config(configs["vae"]))
        vae_state = {k[len(VAE_PREFIX) :]: v for k, v in state.items() if k.startswith(VAE_PREFIX)}
        assign("vae", vae, convert_vae(vae_state, vae), "the VAE")
        text_encoder = empty_module(lambda: CLIPTextModel(CLIPTextConfig(**clip_config(configs["text_encoder"]))))
        text_state = convert_text_encoder(state, text_encoder, detected["v2"])
        assign("text_encoder", text_encoder, text_state, "the text encoder")
        tokenizer = single_file_tokenizer(metadata, detected["v2"])
        scheduler_config = dict(reference.DDIM_EPSILON)
        parts = {"unet": unet, "text_encoder": text_encoder, "vae": vae}
        return parts, tokenizer, scheduler_config, SDState(kept=kept)

    # -- text and images ------------------------------------------------------------------------------------------

    def tokenize(self, model: LoadedModel, captions: list[str]) -> list[torch.Tensor]:
        tokenizer = model.text_encoders[0].tokenizer
        ids = tokenizer(
            captions, padding="max_length", max_length=tokenizer.model_max_length, truncation=True, return_tensors="pt"
        ).input_ids
        return [ids]

    def encode_text(self, model: LoadedModel, captions: list[str]) -> Conditioning:
        tokens = self.tokenize(model, captions)
        slot = model.text_encoders[0]
        encoder = slot.encoder
        device = first_weight(encoder).device
        output = encoder(tokens[0].to(device), output_hidden_states=slot.layer_skip > 0)
        if slot.layer_skip > 0:
            # Clip skip: an earlier layer's output, through the final layer norm (as AUTOMATIC1111 does).
            hidden = encoder.final_layer_norm(output.hidden_states[-(slot.layer_skip + 1)])
        else:
            hidden = output.last_hidden_state
        return Conditioning({"hidden_states": hidden})

    def cache_extras(
        self, model: LoadedModel, pixels: torch.Tensor, masks: torch.Tensor | None, depths: list | None = None
    ) -> dict:
        if model.type_info.depth_input:
            return {DEPTH_EXTRA: self.depth_maps(model, pixels, depths)}
        return super().cache_extras(model, pixels, masks)

    def depth_maps(self, model: LoadedModel, pixels: torch.Tensor, files: list | None = None) -> torch.Tensor:
        """SD 2.0 depth: each image's depth map at latent size, in [-1, 1] per image: its depth map file's where
        `files` has one, else the depth estimator's, run where the VAE is (the training device while latents are
        cached: the caching pass hands over pixels on the CPU)."""
        state = model.family_state(SDState)
        latent_size = _latent_size(model, pixels.shape[-2:])
        device = first_weight(model.part("vae")).device
        return depth_maps(state.depth_estimator, state.depth_processor, pixels, files, latent_size, device)

    def batch_extras(self, model: LoadedModel, inputs: BatchInputs) -> dict[str, torch.Tensor]:
        if model.type_info.depth_input:
            return {DEPTH_EXTRA: depth_input(self, model, inputs)}
        if not model.type_info.inpainting or inputs.input_masks is None:
            return {}
        return inpainting_inputs(self, model, inputs)

    def predict(self, model, noisy_latents, timesteps, conditioning, extra) -> Prediction:
        unet = model.part("unet")
        sample = noisy_latents
        if "mask" in extra:
            sample = torch.cat([noisy_latents, extra["mask"], extra["masked_latents"]], dim=1)
        if DEPTH_EXTRA in extra:  # as StableDiffusionDepth2ImgPipeline: the latents, then the depth map
            sample = torch.cat([noisy_latents, extra[DEPTH_EXTRA].to(noisy_latents)], dim=1)
        dtype = first_weight(unet).dtype
        return Prediction(unet(sample.to(dtype), timesteps, conditioning.hidden_states.to(dtype)).sample)

    # -- sampling -------------------------------------------------------------------------------------------------

    def pipeline(self, model: LoadedModel, sampler):
        from diffusers import StableDiffusionInpaintPipeline, StableDiffusionPipeline

        if model.type_info.depth_input:
            from diffusers import StableDiffusionDepth2ImgPipeline

            state = model.family_state(SDState)
            return StableDiffusionDepth2ImgPipeline(
                vae=model.part("vae"),
                text_encoder=model.part("text_encoder"),
                tokenizer=model.text_encoders[0].tokenizer,
                unet=model.part("unet"),
                scheduler=sampler,
                depth_estimator=state.depth_estimator,
                feature_extractor=state.depth_processor,
            )
        cls = StableDiffusionInpaintPipeline if model.type_info.inpainting else StableDiffusionPipeline
        return cls(
            vae=model.part("vae"),
            text_encoder=model.part("text_encoder"),
            tokenizer=model.text_encoders[0].tokenizer,
            unet=model.part("unet"),
            scheduler=sampler,
            safety_checker=None,
            feature_extractor=None,
            requires_safety_checker=False,
        )

    def pipeline_arguments(self, model: LoadedModel, sample, zero_terminal_snr: bool) -> dict:
        arguments = super().pipeline_arguments(model, sample, zero_terminal_snr)
        if model.type_info.depth_input:
            arguments.update(depth_sample_inputs(self, model, sample))
        return arguments

    # -- saving ---------------------------------------------------------------------------------------------------

    def original_state_dict(self, model: LoadedModel, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        """The whole model in the original (LDM) key layout, as A1111, Forge and ComfyUI read it."""
        unet, vae, text_encoder = model.part("unet"), model.part("vae"), model.part("text_encoder")
        out = {UNET_PREFIX + k: v for k, v in ldm_keys.unet_to_ldm(plain_state(unet), unet.config).items()}
        out.update({VAE_PREFIX + k: v for k, v in ldm_keys.vae_to_ldm(plain_state(vae), vae.config).items()})
        if is_sd2(model.model_type):
            text = {
                TEXT_PREFIX + "model." + k: v for k, v in ldm_keys.openclip_to_ldm(plain_state(text_encoder)).items()
            }
            text.update(model.family_state(SDState).kept)
        else:
            text = {TEXT_PREFIX + k: v for k, v in ldm_keys.clip_to_ldm(plain_state(text_encoder)).items()}
        out.update(text)
        out.update(schedule_markers(model))
        return cast_state(out, dtype)

    # -- names ----------------------------------------------------------------------------------------------------

    def kohya_name(self, model: LoadedModel, part: str, module_path: str) -> str:
        if part == "unet":
            return "lora_unet_" + module_path.replace(".", "_")
        return "lora_te_" + with_text_model(module_path).replace(".", "_")

    def metadata_kind(self, model: LoadedModel) -> ModelKind:
        if is_sd2(model.model_type):
            return KINDS["sd2-v" if model.v_prediction else "sd2"]
        return KINDS["sd1"]


# ---------------------------------------------------------------------------------------------------------------------


def _check_model_type(unet_config, model_type: ModelType, source: str) -> None:
    """The model must be what the model type says: SD 2.x UNets use linear projections, inpainting ones 9 inputs,
    depth ones 5."""
    v2 = bool(unet_config.get("use_linear_projection"))
    inpainting = unet_config.get("in_channels") == 9
    if v2 != is_sd2(model_type):
        kind = "an SD 2.x" if v2 else "an SD 1.x"
        raise ModelLoadError(f"{source} is {kind} model, which does not fit the model type {model_type.value}")
    check_inpainting(inpainting, model_type, source)
    depth = unet_config.get("in_channels") == 5
    if depth != model_type_info(model_type).depth_input:
        which = "a depth" if depth else "not a depth"
        raise ModelLoadError(f"{source} is {which} model, which does not fit the model type {model_type.value}")


def _load_depth_estimator(where, options: dict):
    """SD 2.0 depth's depth estimator and its image processor, in float32 (DPT-Hybrid's batch norms do not take
    float16: the pipeline autocasts them for the same reason)."""
    from transformers import DPTForDepthEstimation, DPTImageProcessor

    estimator = load_diffusers_component(DPTForDepthEstimation, where, "depth_estimator", options, dtype=torch.float32)
    processor = load_diffusers_component(DPTImageProcessor, where, "feature_extractor", options)
    return estimator.eval().requires_grad_(False), processor


def _latent_size(model: LoadedModel, size) -> tuple[int, int]:
    scale = 2 ** (len(model.part("vae").config.block_out_channels) - 1)
    return int(size[0]) // scale, int(size[1]) // scale


def _detect_checkpoint(state: dict, path: Path) -> dict:
    conv_in = state.get(UNET_PREFIX + "input_blocks.0.0.weight")
    if conv_in is None:
        raise ModelLoadError(f"{path} is not a Stable Diffusion checkpoint (no UNet weights in the original layout)")
    return {
        "v2": any(k.startswith(TEXT_PREFIX + "model.") for k in state),
        "inpainting": conv_in.shape[1] == 9,
    }


def _reference_configs(model_type: ModelType) -> dict:
    unets = {
        ModelType.STABLE_DIFFUSION_15: reference.SD15_UNET,
        ModelType.STABLE_DIFFUSION_15_INPAINTING: reference.SD15_INPAINTING_UNET,
        ModelType.STABLE_DIFFUSION_20_BASE: reference.SD2_BASE_UNET,
        ModelType.STABLE_DIFFUSION_21_BASE: reference.SD2_BASE_UNET,
        ModelType.STABLE_DIFFUSION_20: reference.SD2_768_UNET,
        ModelType.STABLE_DIFFUSION_21: reference.SD21_768_UNET,
        ModelType.STABLE_DIFFUSION_20_INPAINTING: reference.SD2_INPAINTING_UNET,
    }
    # (a depth model is never read from a single file: `load_single_file` refuses it before)
    text = reference.OPEN_CLIP_H_TEXT if is_sd2(model_type) else reference.CLIP_L_TEXT
    return {"unet": unets[model_type], "vae": reference.SD_VAE, "text_encoder": text}
