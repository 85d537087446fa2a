"""Stable Diffusion 1.5 and 2.x (512 epsilon, 768 v-prediction, inpainting): one UNet, one CLIP text encoder, a VAE."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from onetrainer.config.enums import ModelFormat, ModelType
from onetrainer.config.model_types import SD, model_type_info
from onetrainer.families import reference_configs as reference
from onetrainer.families.base import (
    BatchInputs,
    Conditioning,
    Family,
    LoadedModel,
    TextEncoderSlot,
    first_weight,
)
from onetrainer.families.loading import (
    ModelLoadError,
    cast_parts,
    checked_load,
    hub_options,
    load_diffusers_component,
    load_tokenizer,
)
from onetrainer.families.sd_common import (
    CONFIGS_KEY,
    TEXT_PREFIX,
    TOKENIZER_KEY,
    UNET_PREFIX,
    VAE_PREFIX,
    clip_config,
    convert_text_encoder,
    convert_vae,
    discrete_schedule,
    inpainting_cache,
    inpainting_inputs,
    inpainting_sample_inputs,
    merges_of,
    plain_state,
    save_pipeline_folder,
    schedule_markers,
    single_file_tokenizer,
    unet_conv_input_sizes,
    wants_v_prediction,
)
from onetrainer.families.sources import ModelNotFound, ModelSource, resolve_local, resolve_source
from onetrainer.noise.prediction import Prediction
from onetrainer.util.fs import atomic_file
from onetrainer.util.threads import library_attribute
from onetrainer.weights import ldm_keys
from onetrainer.weights.checkpoint_files import load_state_dict, read_safetensors_metadata
from onetrainer.weights.metadata import KINDS, ModelKind, model_metadata

if TYPE_CHECKING:
    from onetrainer.config import TrainConfig

log = logging.getLogger(__name__)


def is_sd2(model_type: ModelType) -> bool:
    return model_type.value.startswith("STABLE_DIFFUSION_2")


class StableDiffusionFamily(Family):
    info = SD
    saved_scheduler = "DDIMScheduler"  # the sampler a saved diffusers folder names (what the model's authors ship)
    sampling_parts = frozenset(SD.parts)

    # -- loading --------------------------------------------------------------------------------------------------

    def load(self, config: TrainConfig) -> LoadedModel:
        model_type = config.model_type
        parts, tokenizer, scheduler_config, extra = self._read_source(config)
        _check_model_type(parts["unet"].config, model_type, config.base_model_name)
        if config.vae.model_name:
            parts["vae"] = self._load_vae_override(config, parts["vae"].config)
        cast_parts(parts, config)
        v_prediction = wants_v_prediction(config, model_type)
        slot = TextEncoderSlot(
            "text_encoder", parts["text_encoder"], tokenizer, "lora_te", "emb_params", config.text_encoder.layer_skip
        )
        zero_terminal_snr = config.rescale_noise_scheduler_to_zero_terminal_snr
        schedule = discrete_schedule(scheduler_config, v_prediction, zero_terminal_snr)
        return LoadedModel(model_type, parts, [slot], schedule, config.base_model_name, extra)

    def _read_source(self, config: TrainConfig):
        """The parts, tokenizer(s), scheduler config and extras of the base model, wherever it is."""
        source = resolve_source(config.base_model_name)
        if source.kind == "single_file":
            return self._load_single_file(source.path, config.model_type)
        if source.kind == "backup":
            source = ModelSource("diffusers", str(_backup_model_dir(source.path)))
        return self._load_diffusers(source, config)

    def _load_diffusers(self, source: ModelSource, config: TrainConfig):
        from diffusers import AutoencoderKL, DDPMScheduler, UNet2DConditionModel
        from transformers import CLIPTextModel

        options = hub_options(source, config)
        where = source.location
        parts = {
            "unet": load_diffusers_component(UNet2DConditionModel, where, "unet", options),
            "text_encoder": load_diffusers_component(CLIPTextModel, where, "text_encoder", options),
            "vae": load_diffusers_component(AutoencoderKL, where, "vae", options),
        }
        tokenizer = load_tokenizer(where, options)
        scheduler_config = load_diffusers_component(DDPMScheduler, where, "scheduler", options, config_only=True)
        return parts, tokenizer, scheduler_config, {}

    def _load_vae_override(self, config: TrainConfig, base_config) -> torch.nn.Module:
        """The VAE named in the config: a diffusers folder (a VAE's, or a pipeline's with a vae/ subfolder), a single
        file, or a hub id (a VAE repo or a pipeline repo), loaded like the base model (from the cache when offline)."""
        from diffusers import AutoencoderKL

        name = config.vae.model_name.strip()
        path = resolve_local(name)
        if path.is_dir():
            subfolder = "vae" if (path / "vae" / "config.json").is_file() else None
            return AutoencoderKL.from_pretrained(str(path), subfolder=subfolder, local_files_only=True)
        if path.is_file():
            state = load_state_dict(path)
            vae = AutoencoderKL.from_config(dict(base_config))
            prefix = VAE_PREFIX if any(k.startswith(VAE_PREFIX) for k in state) else ""
            converted = convert_vae({k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}, vae)
            checked_load(vae, converted, f"VAE {path}")
            return vae
        try:
            source = resolve_source(name)
        except ModelNotFound as e:
            raise ModelLoadError(f"VAE override (vae.model_name) not found: {e}") from e
        options = hub_options(source, config, "the VAE override")
        try:  # a VAE repo keeps its config at the top; a pipeline repo in vae/
            return AutoencoderKL.from_pretrained(name, **options)
        except (OSError, ValueError):
            return load_diffusers_component(AutoencoderKL, name, "vae", options)

    def _load_single_file(self, path: Path, model_type: ModelType):
        from diffusers import AutoencoderKL, UNet2DConditionModel
        from diffusers.loaders.single_file_utils import convert_ldm_unet_checkpoint
        from transformers import CLIPTextConfig, CLIPTextModel

        state = load_state_dict(path)
        metadata = read_safetensors_metadata(path) if path.suffix.lower() == ".safetensors" else {}
        detected = _detect_checkpoint(state, path)
        expected_v2 = is_sd2(model_type)
        if detected["v2"] != expected_v2:
            kind = "SD 2.x" if detected["v2"] else "SD 1.x"
            raise ModelLoadError(
                f"{path} is an {kind} checkpoint, which does not fit the model type {model_type.value}"
            )
        if detected["inpainting"] != model_type_info(model_type).inpainting:
            which = "an inpainting" if detected["inpainting"] else "not an inpainting"
            raise ModelLoadError(f"{path} is {which} checkpoint, which does not fit the model type {model_type.value}")

        configs = json.loads(metadata[CONFIGS_KEY]) if CONFIGS_KEY in metadata else _reference_configs(model_type)
        unet = UNet2DConditionModel.from_config(configs["unet"])
        checked_load(unet, convert_ldm_unet_checkpoint(state, unet.config), f"the UNet of {path}")
        vae = AutoencoderKL.from_config(configs["vae"])
        vae_state = {k[len(VAE_PREFIX) :]: v for k, v in state.items() if k.startswith(VAE_PREFIX)}
        checked_load(vae, convert_vae(vae_state, vae), f"the VAE of {path}")
        text_encoder = CLIPTextModel(CLIPTextConfig(**clip_config(configs["text_encoder"])))
        checked_load(
            text_encoder, convert_text_encoder(state, text_encoder, detected["v2"]), f"the text encoder of {path}"
        )
        tokenizer = single_file_tokenizer(metadata, detected["v2"])
        scheduler_config = dict(reference.DDIM_EPSILON)
        kept = {k: v for k, v in state.items() if k.startswith(TEXT_PREFIX + "model.transformer.resblocks.23.")}
        return {"unet": unet, "text_encoder": text_encoder, "vae": vae}, tokenizer, scheduler_config, {"kept": kept}

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

    def encode_images(self, model: LoadedModel, pixels: torch.Tensor) -> torch.Tensor:
        vae = model.part("vae")
        weight = first_weight(vae)
        latents = vae.encode(pixels.to(weight.device, weight.dtype)).latent_dist.mode()
        return latents * vae.config.scaling_factor

    def cache_extras(self, model: LoadedModel, pixels: torch.Tensor, masks: torch.Tensor | None) -> dict:
        if not model.type_info.inpainting or masks is None:
            return {}
        return inpainting_cache(self, model, pixels, masks)

    def batch_extras(self, model: LoadedModel, inputs: BatchInputs) -> dict[str, torch.Tensor]:
        if not model.type_info.inpainting or inputs.input_masks is None:
            return {}
        return inpainting_inputs(self, model, inputs)

    def predict(self, model, noisy_latents, timesteps, conditioning, extra) -> Prediction:
        unet = model.part("unet")
        sample = noisy_latents
        if "mask" in extra:
            sample = torch.cat([noisy_latents, extra["mask"], extra["masked_latents"]], dim=1)
        dtype = first_weight(unet).dtype
        return Prediction(unet(sample.to(dtype), timesteps, conditioning.hidden_states.to(dtype)).sample)

    def conv_input_sizes(self, model: LoadedModel, part: str, height: int, width: int) -> dict[str, tuple[int, int]]:
        if part != self.denoiser_part:
            return {}
        return unet_conv_input_sizes(model.part(part), model.part("vae"), height, width)

    # -- sampling -------------------------------------------------------------------------------------------------

    def sample(self, model: LoadedModel, sample, apply_embeddings, zero_terminal_snr: bool):
        from onetrainer.sampling.sampler import render_pipeline

        return render_pipeline(self, model, sample, apply_embeddings, zero_terminal_snr)

    def pipeline_arguments(self, model: LoadedModel, sample, zero_terminal_snr: bool) -> dict:
        arguments = inpainting_sample_inputs(sample) if model.type_info.inpainting else {}
        if zero_terminal_snr:
            arguments["guidance_rescale"] = 0.7  # the rescale the zero-terminal-SNR paper samples with
        return arguments

    def pipeline(self, model: LoadedModel, sampler):
        from diffusers import StableDiffusionInpaintPipeline, StableDiffusionPipeline

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

    # -- saving ---------------------------------------------------------------------------------------------------

    def save(
        self, model: LoadedModel, fmt: ModelFormat, destination: Path, dtype: torch.dtype, metadata: dict | None = None
    ) -> None:
        if fmt is ModelFormat.DIFFUSERS:
            self.save_diffusers(model, destination, dtype)
        elif fmt in (ModelFormat.ORIGINAL_SINGLE_FILE, ModelFormat.LEGACY_SAFETENSORS):
            self.save_single_file(model, destination, dtype, metadata)
        else:
            raise ValueError(f"{fmt.value} is not a model format of {self.info.label}")

    def save_diffusers(self, model: LoadedModel, destination: Path, dtype: torch.dtype) -> None:

        scheduler = library_attribute("diffusers", self.saved_scheduler).from_config(model.schedule.scheduler_config)
        save_pipeline_folder(self.pipeline(model, scheduler), destination, dtype)

    def save_backup(self, model: LoadedModel, folder: Path) -> None:
        """A diffusers folder: the backup can also be used as a base model."""
        self.save_diffusers(model, folder, torch.float32)

    def backup_state(self, model: LoadedModel, folder: Path, part: str) -> dict[str, torch.Tensor]:
        # transformers saves CLIPTextModel's weights with a `text_model.` level its state dict may not have.
        own = set(model.part(part).state_dict())
        state = super().backup_state(model, folder, part)
        return {(k if k in own else k.removeprefix("text_model.")): v for k, v in state.items()}

    def original_state_dict(self, model: LoadedModel, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        """The whole model in the original (LDM) key layout, as A1111, Forge and ComfyUI read it."""
        unet, vae, text_encoder = model.part("unet"), model.part("vae"), model.part("text_encoder")
        out = {UNET_PREFIX + k: v for k, v in ldm_keys.unet_to_ldm(plain_state(unet), unet.config).items()}
        out.update({VAE_PREFIX + k: v for k, v in ldm_keys.vae_to_ldm(plain_state(vae), vae.config).items()})
        if is_sd2(model.model_type):
            text = {
                TEXT_PREFIX + "model." + k: v for k, v in ldm_keys.openclip_to_ldm(plain_state(text_encoder)).items()
            }
            text.update(model.extra.get("kept", {}))
        else:
            text = {TEXT_PREFIX + k: v for k, v in ldm_keys.clip_to_ldm(plain_state(text_encoder)).items()}
        out.update(text)
        out.update(schedule_markers(model))
        return {
            k: v.detach().to("cpu", dtype if v.is_floating_point() else v.dtype).contiguous() for k, v in out.items()
        }

    def save_single_file(
        self, model: LoadedModel, destination: Path, dtype: torch.dtype, extra_metadata: dict | None = None
    ) -> None:
        from safetensors.torch import save_file

        state = self.original_state_dict(model, dtype)
        info = model.type_info
        metadata = model_metadata(
            self.metadata_kind(model), Path(destination).stem, (info.resolution, info.resolution), model.v_prediction
        )
        metadata[CONFIGS_KEY] = json.dumps({name: _config_of(part) for name, part in model.parts.items()}, default=str)
        tokenizer = model.text_encoders[0].tokenizer
        if len(tokenizer) != 49408:
            # Only a tokenizer other than CLIP's standard one (49408 tokens) travels inside the file: a reader has the
            # standard one, not another vocabulary.
            metadata[TOKENIZER_KEY] = json.dumps({"vocab": tokenizer.get_vocab(), "merges": merges_of(tokenizer)})
        metadata.update(extra_metadata or {})
        with atomic_file(destination) as tmp:
            save_file(state, str(tmp), metadata=metadata)

    # -- names ----------------------------------------------------------------------------------------------------

    def kohya_name(self, model: LoadedModel, part: str, module_path: str) -> str:
        if part == "unet":
            return "lora_unet_" + module_path.replace(".", "_")
        body = module_path if module_path.startswith("text_model.") else "text_model." + module_path
        return "lora_te_" + body.replace(".", "_")

    def metadata_kind(self, model: LoadedModel) -> ModelKind:
        if is_sd2(model.model_type):
            return KINDS["sd2-v" if model.v_prediction else "sd2"]
        return KINDS["sd1"]


# ---------------------------------------------------------------------------------------------------------------------


def _config_of(part: torch.nn.Module) -> dict:
    """A part's config as plain data: diffusers models keep a frozen dict, transformers models a config object."""
    config = part.config
    return config.to_dict() if hasattr(config, "to_dict") else dict(config)


def _backup_model_dir(backup: Path) -> Path:
    folder = backup / "model"
    if (folder / "model_index.json").is_file():
        return folder
    raise ModelLoadError(
        f"{backup} is a backup of a LoRA or embedding run, not a whole model: resume it with 'Continue from last "
        "backup', or use its LoRA / embedding file"
    )


def _check_model_type(unet_config, model_type: ModelType, source: str) -> None:
    """The model must be what the model type says: SD 2.x UNets use linear projections, inpainting ones 9 inputs."""
    v2 = bool(unet_config.get("use_linear_projection"))
    inpainting = unet_config.get("in_channels") == 9
    if v2 != is_sd2(model_type):
        kind = "an SD 2.x" if v2 else "an SD 1.x"
        raise ModelLoadError(f"{source} is {kind} model, which does not fit the model type {model_type.value}")
    if inpainting != model_type_info(model_type).inpainting:
        which = "an inpainting" if inpainting else "not an inpainting"
        raise ModelLoadError(f"{source} is {which} model, which does not fit the model type {model_type.value}")


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
    text = reference.OPEN_CLIP_H_TEXT if is_sd2(model_type) else reference.CLIP_L_TEXT
    return {"unet": unets[model_type], "vae": reference.SD_VAE, "text_encoder": text}
