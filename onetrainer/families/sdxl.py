"""Stable Diffusion XL 1.0 (+ inpainting): a UNet conditioned on two CLIP text encoders, a pooled embedding and the
image's size and crop (the "time ids"), and a VAE.

Text: CLIP-L and OpenCLIP-bigG each give the penultimate layer's hidden states (clip skip counts from there, as in
diffusers' SDXL pipeline); they are concatenated along the feature axis. The pooled, projected output of the second
encoder and six numbers (original height and width, crop top and left, target height and width) form the UNet's
added conditioning.

Files: diffusers folders, hub ids, and original (SGM) single files, read offline with diffusers' converters on models
built from the bundled full-size configs (or the configs embedded in single files we write).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

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
    UNET_PREFIX,
    StableDiffusionBase,
    clip_config,
    convert_text_encoder,
    schedule_markers,
    single_file_tokenizer,
    wants_v_prediction,
)
from onetrainer.families.sdxl_info import SDXL
from onetrainer.families.sources import ModelSource
from onetrainer.families.text_encoding import pool_at_end_token
from onetrainer.families.vae import VAE_PREFIX, convert_vae, load_vae_override
from onetrainer.noise.prediction import Prediction
from onetrainer.weights import ldm_keys
from onetrainer.weights.checkpoint_files import load_state_dict, read_safetensors_metadata
from onetrainer.weights.clip_names import with_text_model
from onetrainer.weights.metadata import KINDS, ModelKind

if TYPE_CHECKING:
    from onetrainer.config import TrainConfig

log = logging.getLogger(__name__)

CLIP_L_PREFIX = "conditioner.embedders.0."  # + transformer.text_model.…
CLIP_G_PREFIX = "conditioner.embedders.1.model."  # OpenCLIP layout: transformer.resblocks.N.…, text_projection
KOHYA_PREFIXES = {"unet": "lora_unet", "text_encoder": "lora_te1", "text_encoder_2": "lora_te2"}


@dataclass(slots=True)
class SDXLState(FamilyState):
    """What an SDXL model keeps besides its parts: its pipeline's `force_zeros_for_empty_prompt` (model_index.json;
    True where it does not say, and for a single file), the negative prompt of its samples when none is given."""

    force_zeros_for_empty_prompt: bool = True


class StableDiffusionXLFamily(StableDiffusionBase):
    """Shares with SD (`sd_common.StableDiffusionBase`) the image encoding, inpainting's cache, sampling and saving;
    the rest is SDXL's own."""

    info = SDXL
    saved_scheduler = "EulerDiscreteScheduler"
    sampling_parts = frozenset(SDXL.parts)

    # -- loading --------------------------------------------------------------------------------------------------

    def load(self, config: TrainConfig) -> LoadedModel:
        model_type = config.model_type
        parts = KeptParts(config)
        tokenizers, scheduler_config, state = self.read_source(config, parts)
        _check_model_type(parts["unet"].config, model_type, config.base_model_name)
        if config.vae.model_name:
            parts["vae"] = load_vae_override(config, parts["vae"].config)
        for part, tokenizer in zip(("text_encoder", "text_encoder_2"), tokenizers):
            pool_at_end_token(parts[part], tokenizer)
        v_prediction = wants_v_prediction(config, model_type)
        slots = [
            TextEncoderSlot("text_encoder", parts["text_encoder"], tokenizers[0], "lora_te1", "clip_l"),
            TextEncoderSlot("text_encoder_2", parts["text_encoder_2"], tokenizers[1], "lora_te2", "clip_g"),
        ]
        for slot in slots:
            slot.layer_skip = config.part(slot.part).layer_skip
        zero_terminal_snr = config.rescale_noise_scheduler_to_zero_terminal_snr
        schedule = discrete_schedule(scheduler_config, v_prediction, zero_terminal_snr)
        return LoadedModel(model_type, parts, slots, schedule, config.base_model_name, state)

    def load_diffusers(self, source: ModelSource, config: TrainConfig, parts: KeptParts):
        from diffusers import AutoencoderKL, DDPMScheduler, DiffusionPipeline, UNet2DConditionModel
        from transformers import CLIPTextModel, CLIPTextModelWithProjection

        options = hub_options(source, config)
        where = source.location
        if source.kind != "hub":
            _check_folder(Path(where), config.model_type)
        classes = {
            "unet": UNet2DConditionModel,
            "text_encoder": CLIPTextModel,
            "text_encoder_2": CLIPTextModelWithProjection,
            "vae": AutoencoderKL,
        }
        for part, cls in classes.items():
            parts[part] = load_diffusers_component(cls, where, part, options, dtype=load_dtype(config, part))
        tokenizers = (load_tokenizer(where, options), load_tokenizer(where, options, subfolder="tokenizer_2"))
        scheduler_config = load_diffusers_component(DDPMScheduler, where, "scheduler", options, config_only=True)
        try:
            index = DiffusionPipeline.load_config(where, **options)
        except (OSError, ValueError):
            index = {}
        state = SDXLState(force_zeros_for_empty_prompt=bool(index.get("force_zeros_for_empty_prompt", True)))
        return tokenizers, scheduler_config, state

    def load_single_file(self, path: Path, config: TrainConfig):
        from diffusers import AutoencoderKL, UNet2DConditionModel
        from diffusers.loaders.single_file_utils import convert_ldm_unet_checkpoint
        from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

        model_type = config.model_type
        owners = {UNET_PREFIX: "unet", VAE_PREFIX: "vae", CLIP_L_PREFIX: "text_encoder"}
        owners[CLIP_G_PREFIX] = "text_encoder_2"
        state = load_state_dict(path, read_dtypes(config, owners))
        metadata = read_safetensors_metadata(path) if path.suffix.lower() == ".safetensors" else {}
        _check_checkpoint(state, path, model_type)
        configs = json.loads(metadata[CONFIGS_KEY]) if CONFIGS_KEY in metadata else _reference_configs(model_type)

        # Built in float32 and the file's tensors copied in before: the weights as that copy and the cast left them.
        def assign(part: str, module: torch.nn.Module, weights: dict, what: str) -> torch.nn.Module:
            return assign_weights(module, weights, load_dtype(config, part), f"{what} of {path}", torch.float32)

        unet = empty_module(lambda: UNet2DConditionModel.from_config(configs["unet"]))
        assign("unet", unet, convert_ldm_unet_checkpoint(state, unet.config), "the UNet")
        vae = empty_module(lambda: AutoencoderKL.from_config(configs["vae"]))
        vae_state = {k[len(VAE_PREFIX) :]: v for k, v in state.items() if k.startswith(VAE_PREFIX)}
        assign("vae", vae, convert_vae(vae_state, vae), "the VAE")
        text_encoder = empty_module(lambda: CLIPTextModel(CLIPTextConfig(**clip_config(configs["text_encoder"]))))
        assign("text_encoder", text_encoder, convert_text_encoder(state, text_encoder, False), "text encoder 1")
        text_encoder_2 = empty_module(
            lambda: CLIPTextModelWithProjection(CLIPTextConfig(**clip_config(configs["text_encoder_2"])))
        )
        assign("text_encoder_2", text_encoder_2, _convert_open_clip_g(state, text_encoder_2), "text encoder 2")

        # The two tokenizers share CLIP's vocabulary; the first pads with the end token, the second with "!".
        tokenizers = (single_file_tokenizer(metadata, False), single_file_tokenizer(metadata, True))
        parts = {"unet": unet, "text_encoder": text_encoder, "text_encoder_2": text_encoder_2, "vae": vae}
        return parts, tokenizers, dict(reference.EULER_EPSILON), SDXLState()

    # -- text and images ------------------------------------------------------------------------------------------

    def tokenize(self, model: LoadedModel, captions: list[str]) -> list[torch.Tensor]:
        out = []
        for slot in model.text_encoders:
            tokenizer = slot.tokenizer
            out.append(
                tokenizer(
                    captions,
                    padding="max_length",
                    max_length=tokenizer.model_max_length,
                    truncation=True,
                    return_tensors="pt",
                ).input_ids
            )
        return out

    def encode_text(self, model: LoadedModel, captions: list[str]) -> Conditioning:
        tokens = self.tokenize(model, captions)
        hidden, pooled = [], None
        for slot, ids in zip(model.text_encoders, tokens):
            encoder = slot.encoder
            output = encoder(ids.to(first_weight(encoder).device), output_hidden_states=True)
            # SDXL conditions on the penultimate layer, without the final layer norm; clip skip counts from there.
            hidden.append(output.hidden_states[-(slot.layer_skip + 2)])
            if slot.part == "text_encoder_2":
                pooled = output.text_embeds
        dtype = torch.promote_types(hidden[0].dtype, hidden[1].dtype)
        return Conditioning({"hidden_states": torch.cat([h.to(dtype) for h in hidden], dim=-1), "pooled": pooled})

    def drop_captions(
        self,
        model: LoadedModel,
        captions: list[str],
        drops: Sequence[torch.Tensor | None],
        encode: Callable[[list[str]], Conditioning],
    ) -> Conditioning:
        """Each encoder's share by its own mask: `hidden_states` is encoder 1's states then encoder 2's (on the
        feature axis), `pooled` is encoder 2's. A dropped share is the empty caption's (`caption_dropout`)."""
        conditioning = encode(captions)
        dropped = self.dropped_conditioning(conditioning, encode)
        width = model.text_encoders[0].encoder.config.hidden_size  # encoder 1's share of the feature axis
        hidden, empty = conditioning.hidden_states, dropped.hidden_states
        first, second = drops
        shares = [
            _rows_where(first, empty[..., :width], hidden[..., :width]),
            _rows_where(second, empty[..., width:], hidden[..., width:]),
        ]
        pooled = _rows_where(second, dropped.pooled, conditioning.pooled)
        return Conditioning({**conditioning.tensors, "hidden_states": torch.cat(shares, dim=-1), "pooled": pooled})

    def batch_extras(self, model: LoadedModel, inputs: BatchInputs) -> dict[str, torch.Tensor]:
        latents, pixels = inputs.latents, inputs.pixels
        if pixels is not None:
            height, width = pixels.shape[-2:]
        else:  # cached latents: the training size is theirs times the VAE's scale
            scale = _vae_scale(model)
            height, width = latents.shape[-2] * scale, latents.shape[-1] * scale
        count = len(latents)
        sizes = inputs.original_sizes or [(height, width)] * count
        offsets = inputs.crop_offsets or [(0, 0)] * count
        extra = {"time_ids": time_ids(sizes, offsets, (height, width), latents.device)}
        if model.type_info.inpainting and inputs.input_masks is not None:
            # The VAE runs in its own weight dtype (FLOAT_32 by default): SDXL's VAE overflows in FLOAT_16.
            with torch.no_grad(), torch.autocast(inputs.input_masks.device.type, enabled=False):
                extra.update(inpainting_inputs(self, model, inputs))
            extra["masked_latents"] = extra["masked_latents"].float()
        return extra

    def predict(self, model, noisy_latents, timesteps, conditioning, extra) -> Prediction:
        unet = model.part("unet")
        sample = noisy_latents
        if "mask" in extra:
            sample = torch.cat([noisy_latents, extra["mask"], extra["masked_latents"]], dim=1)
        ids = extra.get("time_ids")
        if ids is None:  # no batch information: the image is its own original size, uncropped
            scale = _vae_scale(model)
            size = (noisy_latents.shape[-2] * scale, noisy_latents.shape[-1] * scale)
            ids = time_ids([size] * len(noisy_latents), [(0, 0)] * len(noisy_latents), size, noisy_latents.device)
        dtype = first_weight(unet).dtype
        added = {"text_embeds": conditioning.pooled.to(dtype), "time_ids": ids.to(dtype)}
        output = unet(sample.to(dtype), timesteps, conditioning.hidden_states.to(dtype), added_cond_kwargs=added).sample
        return Prediction(output)

    # -- sampling -------------------------------------------------------------------------------------------------

    def pipeline(self, model: LoadedModel, sampler):
        from diffusers import StableDiffusionXLInpaintPipeline, StableDiffusionXLPipeline

        kwargs = {}
        if model.type_info.inpainting:
            cls = StableDiffusionXLInpaintPipeline
            kwargs["requires_aesthetics_score"] = False  # SDXL inpainting has no refiner-style aesthetic score
        else:
            cls = StableDiffusionXLPipeline
        return cls(
            vae=model.part("vae"),
            text_encoder=model.part("text_encoder"),
            text_encoder_2=model.part("text_encoder_2"),
            tokenizer=model.text_encoders[0].tokenizer,
            tokenizer_2=model.text_encoders[1].tokenizer,
            unet=model.part("unet"),
            scheduler=sampler,
            force_zeros_for_empty_prompt=model.family_state(SDXLState).force_zeros_for_empty_prompt,
            add_watermarker=False,
            **kwargs,
        )

    def prompt_arguments(self, model: LoadedModel, prompt: str, negative_prompt: str | None) -> dict:
        """The prompts as the pipeline takes them. With clip skip, the embeddings are ours: diffusers' SDXL pipeline
        has one clip skip for both encoders and ignores it for the negative prompt."""
        if not any(slot.layer_skip for slot in model.text_encoders):
            return super().prompt_arguments(model, prompt, negative_prompt)
        with torch.no_grad():
            positive = self.encode_text(model, [prompt])
            if negative_prompt is None and model.family_state(SDXLState).force_zeros_for_empty_prompt:
                negative = positive.zeroed(torch.ones(1, dtype=torch.bool))
            else:
                negative = self.encode_text(model, [negative_prompt or ""])
        return {
            "prompt_embeds": positive.hidden_states,
            "pooled_prompt_embeds": positive.pooled,
            "negative_prompt_embeds": negative.hidden_states,
            "negative_pooled_prompt_embeds": negative.pooled,
        }

    # -- saving ---------------------------------------------------------------------------------------------------

    def original_state_dict(self, model: LoadedModel, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        """The whole model in the original (SGM) key layout, as A1111, Forge and ComfyUI read it."""
        unet, vae = model.part("unet"), model.part("vae")
        out = to_original(
            plain_state(unet),
            unet.config,
            plain_state(vae),
            vae.config,
            plain_state(model.part("text_encoder")),
            plain_state(model.part("text_encoder_2")),
        )
        out.update(schedule_markers(model))
        return cast_state(out, dtype)

    # -- names ----------------------------------------------------------------------------------------------------

    def kohya_name(self, model: LoadedModel, part: str, module_path: str) -> str:
        if part == "unet":
            # kohya trains SDXL on the original UNet: its LoRA names are the SGM module names.
            unet_config = model.parts["unet"].config
            return "lora_unet_" + ldm_keys.unet_module_to_ldm(module_path, unet_config).replace(".", "_")
        return f"{KOHYA_PREFIXES[part]}_{with_text_model(module_path).replace('.', '_')}"

    def metadata_kind(self, model: LoadedModel) -> ModelKind:
        return KINDS["sdxl"]


# ---------------------------------------------------------------------------------------------------------------------


def to_original(
    unet: Mapping, unet_config: Mapping, vae: Mapping, vae_config: Mapping, clip_l: Mapping, clip_g: Mapping
) -> dict:
    """diffusers / transformers state dicts of the four parts → one state dict in the original SGM layout."""
    out = {UNET_PREFIX + k: v for k, v in ldm_keys.unet_to_ldm(unet, unet_config).items()}
    out.update({VAE_PREFIX + k: v for k, v in ldm_keys.vae_to_ldm(vae, vae_config).items()})
    out.update({CLIP_L_PREFIX + k: v for k, v in ldm_keys.clip_to_ldm(clip_l).items()})
    out.update({CLIP_G_PREFIX + k: v for k, v in ldm_keys.openclip_to_ldm(clip_g, with_projection=True).items()})
    return out


def time_ids(sizes, offsets, target: tuple[int, int], device) -> torch.Tensor:
    """SDXL's micro-conditioning per image: original (height, width), crop (top, left), target (height, width)."""
    rows = [[*map(float, size), *map(float, offset), float(target[0]), float(target[1])] for size, offset in
            zip(sizes, offsets)]  # fmt: skip
    return torch.tensor(rows, dtype=torch.float32, device=device)


def _vae_scale(model: LoadedModel) -> int:
    return 2 ** (len(model.part("vae").config.block_out_channels) - 1)


def _check_model_type(unet_config, model_type: ModelType, source: str) -> None:
    if unet_config.get("addition_embed_type") != "text_time":
        raise ModelLoadError(f"{source} is not an SDXL model, which does not fit the model type {model_type.value}")
    check_inpainting(unet_config.get("in_channels") == 9, model_type, source)


def _check_folder(folder: Path, model_type: ModelType) -> None:
    """A diffusers folder of another model is refused before its parts are read."""
    index = folder / "model_index.json"
    if not index.is_file():
        return
    data = json.loads(index.read_text(encoding="utf-8"))
    if not (data.get("text_encoder_2") or [None])[0]:
        raise ModelLoadError(f"{folder} is not an SDXL model, which does not fit the model type {model_type.value}")
    if not (data.get("text_encoder") or [None])[0]:
        raise ModelLoadError(f"{folder} has no first text encoder (the SDXL refiner?): only SDXL base models train")


def _check_checkpoint(state: dict, path: Path, model_type: ModelType) -> None:
    conv_in = state.get(UNET_PREFIX + "input_blocks.0.0.weight")
    if conv_in is None:
        raise ModelLoadError(f"{path} is not a Stable Diffusion checkpoint (no UNet weights in the original layout)")
    if CLIP_G_PREFIX + "positional_embedding" not in state:
        if "conditioner.embedders.0.model.text_projection" in state:
            raise ModelLoadError(f"{path} is the SDXL refiner: only SDXL base models can be trained")
        raise ModelLoadError(
            f"{path} is an SD 1.x / 2.x checkpoint, which does not fit the model type {model_type.value}"
        )
    check_inpainting(conv_in.shape[1] == 9, model_type, path, "checkpoint")


def _reference_configs(model_type: ModelType) -> dict:
    unet = reference.SDXL_INPAINTING_UNET if model_type_info(model_type).inpainting else reference.SDXL_UNET
    return {
        "unet": unet,
        "vae": reference.SDXL_VAE,
        "text_encoder": reference.CLIP_L_TEXT,
        "text_encoder_2": reference.OPEN_CLIP_BIGG_TEXT,
    }


def _convert_open_clip_g(state: dict, text_encoder) -> dict:
    from diffusers.loaders.single_file_utils import convert_open_clip_checkpoint

    converted = convert_open_clip_checkpoint(text_encoder, state, prefix=CLIP_G_PREFIX)
    own = set(text_encoder.state_dict())
    # CLIPTextModelWithProjection keeps its `text_model.` level in transformers 5; match either spelling.
    out = {}
    for key, value in converted.items():
        if key in own:
            out[key] = value
        elif f"text_model.{key}" in own:
            out[f"text_model.{key}"] = value
    return out


def _rows_where(drop: torch.Tensor | None, dropped: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
    """`kept` with the rows where `drop` ([B] bool) is true taken from `dropped` (None: none dropped)."""
    if drop is None:
        return kept
    mask = drop.to(kept.device).view(-1, *([1] * (kept.dim() - 1)))
    return torch.where(mask, dropped.to(kept.device, kept.dtype), kept)
