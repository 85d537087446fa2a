"""Würstchen v2 and Stable Cascade: the prior (stage C) is trained on EfficientNet latents; the decoder (stage B) and
the VQGAN (stage A) only render samples. `WuerstchenPriorFamily` is what both do alike; `WuerstchenFamily` and
`CascadeFamily` each override what differs: the prior's and decoder's classes, the text conditioning, the latent
scaling, the time remap, the decoder's inputs, the saved formats and the LoRA names.

The public warp-ai folders do not load as a diffusers pipeline (their model_index.json names the library
`wuerstchen`), so every part loads from its own subfolder.
"""

from __future__ import annotations

import contextlib
import math
from abc import abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import torch
from PIL import Image

from onetrainer.config.enums import DataType, ModelFormat
from onetrainer.families import effnet
from onetrainer.families.base import (
    CaptionDropout,
    Conditioning,
    Family,
    FamilyState,
    LoadedModel,
    TextEncoderSlot,
    Writer,
    first_weight,
)
from onetrainer.families.loading import (
    KeptParts,
    ModelLoadError,
    assign_weights,
    backup_model_source,
    empty_module,
    hub_options,
    load_diffusers_component,
    load_dtype,
    load_tokenizer,
)
from onetrainer.families.saving import model_file_metadata, plain_state, save_pipeline_folder, write_single_file
from onetrainer.families.sources import ModelSource, is_hub_id, resolve_local, resolve_source
from onetrainer.families.wuerstchen_info import CASCADE, WUERSTCHEN
from onetrainer.noise.cosine import ContinuousCosineSchedule
from onetrainer.noise.prediction import Prediction
from onetrainer.precision.dtypes import fallback_dtype, torch_dtype
from onetrainer.weights import cascade_keys, cascade_lora
from onetrainer.weights.clip_names import with_text_model
from onetrainer.weights.metadata import ModelKind

if TYPE_CHECKING:
    from onetrainer.config import TrainConfig

TOKENS = 77
CLIP_IMAGE_WIDTH = 768  # Stable Cascade's (unused) image conditioning: zeros (B, 1, 768) at the real width
DECODER_STEPS = 10
# The prior's latents per image pixel: 0.75 · 1/32 (the effnet's input scale and its downsampling).
PRIOR_RESOLUTION_MULTIPLE = 42.67
DECODER_LATENT_SCALE = 10.67
# The files that may hold the EfficientNet encoder in a hub repository (the family's declaration, in order).
EFFNET_FILES = tuple(names[0] for names in WUERSTCHEN.part_hub_file_sets["effnet_encoder"])


def wuerstchen_remap(t: torch.Tensor) -> torch.Tensor:
    return (1.08 * t + 0.001).clamp(0.001, 1.0)


def cascade_remap(t: torch.Tensor) -> torch.Tensor:
    return (t + 0.001).clamp(0.001, 1.0)


@dataclass(slots=True)
class WuerstchenState(FamilyState):
    """What a Würstchen / Stable Cascade model keeps besides its parts: the decoder's tokenizer (samples run the
    decoder stages), and the dtype the prior computes in under a FLOAT_16 autocast (None: as the autocast)."""

    decoder_tokenizer: object | None = None
    prior_autocast: torch.dtype | None = None


class WuerstchenPriorFamily(Family):
    """What Würstchen v2 and Stable Cascade do alike: part-wise loading, CLIP tokens, effnet latents, the cosine
    schedule, sampling prior (CFG) → decoder → VQGAN, the prior pipeline folder. Each variant is a subclass that
    declares its facts (`info`, parts, `remap`, `kind`, `writers`) and overrides the methods marked abstract."""

    caption_dropout = CaptionDropout.EMPTY_CAPTION
    broken_sample_advice = (
        "set the decoder's and its VQGAN's weight data types (decoder.weight_dtype, decoder_vqgan.weight_dtype) to "
        "FLOAT_32 or BFLOAT_16"
    )
    # The model time of a training time t (see `ContinuousCosineSchedule`); a staticmethod, so not bound.
    remap: ClassVar[Callable[[torch.Tensor], torch.Tensor]]
    kind: ClassVar[ModelKind]  # what file metadata says the model is
    # The config attribute of the prior's and the decoder's input channel count.
    channels_key: ClassVar[str]
    # -- loading --------------------------------------------------------------------------------------------------

    def load(self, config: TrainConfig) -> LoadedModel:
        source = resolve_source(config.base_model_name)
        if source.kind == "backup":
            source = backup_model_source(source.path)
        if source.kind not in ("diffusers", "hub"):
            raise ModelLoadError(
                f"{config.base_model_name}: load {self.info.label} from a diffusers prior folder or hub id"
            )
        options = hub_options(source, config, file_sets=self.info.hub_file_sets)
        where = source.location
        parts = KeptParts(config)
        parts["prior"] = self._load_prior(config, where, options)
        dtype = load_dtype(config, "text_encoder")
        parts["text_encoder"] = load_diffusers_component(
            self.text_encoder_class(), where, "text_encoder", options, dtype=dtype
        )
        tokenizer = load_tokenizer(where, options)
        decoder_tokenizer = self._load_decoder(config, parts)
        parts["effnet_encoder"] = self.effnet_encoder(config)
        for module in parts.values():
            module.requires_grad_(False)
        slot = TextEncoderSlot("text_encoder", parts["text_encoder"], tokenizer, "lora_te", "clip_g")
        schedule = ContinuousCosineSchedule(self.remap)
        state = WuerstchenState(decoder_tokenizer, self.prior_autocast_dtype(config))
        return LoadedModel(config.model_type, parts, [slot], schedule, config.base_model_name, state)

    @abstractmethod
    def prior_class(self) -> type:
        """The diffusers class of the prior (stage C)."""

    @abstractmethod
    def decoder_class(self) -> type:
        """The diffusers class of the decoder (stage B)."""

    @abstractmethod
    def text_encoder_class(self) -> type:
        """The transformers class of the prior's text encoder."""

    @abstractmethod
    def prior_from_file(self, path: Path, where: str, options: dict, dtype: torch.dtype) -> torch.nn.Module:
        """The prior from a single file named as the prior's model (`prior.model_name`), read in `dtype`."""

    @abstractmethod
    def decoder_name(self, config: TrainConfig) -> str:
        """The decoder's model when `decoder.model_name` is empty."""

    @abstractmethod
    def effnet_encoder(self, config: TrainConfig) -> torch.nn.Module:
        """The EfficientNet encoder (`effnet_encoder.model_name`)."""

    def _load_prior(self, config: TrainConfig, where: str, options: dict) -> torch.nn.Module:
        """The base's prior, or the prior part's own model (`prior.model_name`): a diffusers folder or hub id, or a
        single file (`prior_from_file`)."""
        cls = self.prior_class()
        dtype = load_dtype(config, "prior")
        override = config.part("prior").model_name.strip()
        if not override:
            return load_diffusers_component(cls, where, "prior", options, dtype=dtype)
        path = resolve_local(override)
        if not path.exists() and is_hub_id(override):
            files = self.info.part_hub_file_sets["prior"]
            options = hub_options(ModelSource("hub", override), config, "the prior (prior.model_name)", files)
            return load_diffusers_component(cls, override, "prior", options, dtype=dtype)
        if path.is_dir():
            subfolder = "prior" if (path / "prior" / "config.json").is_file() else None
            return load_diffusers_component(cls, str(path), subfolder, {"local_files_only": True}, dtype=dtype)
        if not path.is_file():
            raise ModelLoadError(f"the prior's model (prior.model_name) was not found: {override}")
        return self.prior_from_file(path, where, options, dtype)

    def _load_decoder(self, config: TrainConfig, parts: KeptParts) -> object:
        """Adds the decoder, the variant's own decoder parts (`load_decoder_extras`) and the decoder's VQGAN to
        `parts`, in declared order; returns the decoder's tokenizer (None where the decoder has no text encoder of its
        own)."""
        from diffusers.pipelines.deprecated.wuerstchen import PaellaVQModel

        name = config.part("decoder").model_name or self.decoder_name(config)
        source = resolve_source(name)
        files = self.info.part_hub_file_sets["decoder"]
        options = hub_options(source, config, "the decoder (decoder.model_name)", files)
        where = source.location
        parts["decoder"] = load_diffusers_component(
            self.decoder_class(), where, "decoder", options, dtype=load_dtype(config, "decoder")
        )
        tokenizer = self.load_decoder_extras(config, where, options, parts)
        parts["decoder_vqgan"] = load_diffusers_component(
            PaellaVQModel, where, "vqgan", options, dtype=load_dtype(config, "decoder_vqgan")
        )
        return tokenizer

    def load_decoder_extras(self, config: TrainConfig, where: str, options: dict, parts: KeptParts) -> object:
        """Adds the variant's own decoder parts to `parts` (each in its `load_dtype`); returns the decoder's tokenizer,
        if it has one."""
        return None

    def prior_autocast_dtype(self, config: TrainConfig) -> torch.dtype | None:
        """The dtype the prior computes in under a FLOAT_16 autocast (`_prior_precision`); None: as the autocast."""
        return None

    # -- text and images ------------------------------------------------------------------------------------------

    def _tokens(self, tokenizer, captions: list[str], device) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = tokenizer(captions, padding="max_length", max_length=TOKENS, truncation=True, return_tensors="pt")
        return tokens.input_ids.to(device), tokens.attention_mask.to(device)

    def encode_text(self, model: LoadedModel, captions: list[str]) -> Conditioning:
        slot = model.text_encoders[0]
        encoder = slot.encoder
        ids, mask = self._tokens(slot.tokenizer, captions, first_weight(encoder).device)
        return self.text_conditioning(encoder, ids, mask)

    @abstractmethod
    def text_conditioning(self, encoder: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> Conditioning:
        """The prior's text conditioning from the text encoder's tokens and their mask."""

    def encode_images(self, model: LoadedModel, pixels: torch.Tensor) -> torch.Tensor:
        encoder = model.part("effnet_encoder")
        weight = first_weight(encoder)
        images = ((pixels.float() + 1) / 2).clamp(0, 1).to(weight.device)
        # Outside any fp16 autocast: the effnet's batch norms overflow in half precision.
        with torch.autocast(weight.device.type, enabled=False):
            latents = self.to_prior_latents(effnet.encode(encoder, images, wuerstchen=False))
        return latents.float()

    def to_prior_latents(self, latents: torch.Tensor) -> torch.Tensor:
        """The effnet's latents as the prior trains on them (default: as they are)."""
        return latents

    def from_prior_latents(self, latents: torch.Tensor) -> torch.Tensor:
        """The inverse of `to_prior_latents`: the prior's sampled latents as the decoder's effnet conditioning."""
        return latents

    # -- sampling -------------------------------------------------------------------------------------------------

    def _scheduler(self, model: LoadedModel, steps: int):
        from diffusers import DDPMWuerstchenScheduler

        scheduler = DDPMWuerstchenScheduler()
        scheduler.set_timesteps(steps, device=first_weight(model.part("prior")).device)
        return scheduler

    def sample(self, model: LoadedModel, sample, apply_embeddings, zero_terminal_snr: bool) -> Image.Image:
        """Prior (CFG) → decoder (10 steps, no CFG) → VQGAN."""
        prior = model.part("prior")
        device = first_weight(prior).device
        generator = torch.Generator().manual_seed(sample.seed)
        positive = self.encode_text(model, [apply_embeddings(sample.prompt)])
        negative = self.encode_text(model, [apply_embeddings(sample.negative_prompt or "")])
        height = math.ceil(sample.height / PRIOR_RESOLUTION_MULTIPLE)
        width = math.ceil(sample.width / PRIOR_RESOLUTION_MULTIPLE)
        channels = getattr(prior.config, self.channels_key)
        latents = torch.randn((1, channels, height, width), generator=generator).to(device)
        scheduler = self._scheduler(model, sample.diffusion_steps)
        for t in scheduler.timesteps[:-1]:
            ratio = t.view(1).to(device)
            eps = self.predict(model, latents, ratio, positive, {}).output.float()
            if sample.cfg_scale != 1.0:
                uncond = self.predict(model, latents, ratio, negative, {}).output.float()
                eps = uncond + sample.cfg_scale * (eps - uncond)
            latents = scheduler.step(eps, ratio, latents).prev_sample
        return self._decode(model, self.from_prior_latents(latents), sample, generator)

    def _decode(self, model: LoadedModel, effnet_latents: torch.Tensor, sample, generator) -> Image.Image:
        from onetrainer.sampling.sampler import to_image

        decoder = model.part("decoder")
        weight = first_weight(decoder)
        device, dtype = weight.device, weight.dtype
        text = self.decoder_text(model, sample.prompt, device, dtype)
        height = int(effnet_latents.shape[2] * DECODER_LATENT_SCALE)
        width = int(effnet_latents.shape[3] * DECODER_LATENT_SCALE)
        channels = getattr(decoder.config, self.channels_key)
        x = torch.randn((1, channels, height, width), generator=generator).to(device, dtype)
        effnet_latents = effnet_latents.to(device, dtype)
        scheduler = self._scheduler(model, DECODER_STEPS)
        for t in scheduler.timesteps[:-1]:
            ratio = t.view(1).to(device, dtype)
            out = self.decoder_step(decoder, x, ratio, effnet_latents, text)
            x = scheduler.step(out.float(), t.view(1), x.float()).prev_sample.to(dtype)
        vqgan = model.part("decoder_vqgan")
        vq_weight = first_weight(vqgan)
        scale = vqgan.config.scale_factor
        pixels = vqgan.decode(x.to(vq_weight.device, vq_weight.dtype) * scale).sample
        return to_image(pixels[0].float().permute(1, 2, 0).cpu().numpy())

    @abstractmethod
    def decoder_text(self, model: LoadedModel, prompt: str, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """The decoder's text conditioning for the prompt, on `device` in `dtype`."""

    @abstractmethod
    def decoder_step(
        self,
        decoder: torch.nn.Module,
        x: torch.Tensor,
        ratio: torch.Tensor,
        effnet_latents: torch.Tensor,
        text: torch.Tensor,
    ) -> torch.Tensor:
        """The decoder's prediction for `x` at `ratio`, conditioned on the effnet latents and `decoder_text`."""

    # -- saving ---------------------------------------------------------------------------------------------------

    def save_diffusers(
        self, model: LoadedModel, destination: Path, dtype: torch.dtype, metadata: dict | None = None
    ) -> None:
        """The prior pipeline folder (prior, text encoder, tokenizer, scheduler) that diffusers writes (`metadata`, a
        single file's header entries, has no place in it)."""
        save_pipeline_folder(self.prior_pipeline(model), destination, dtype)

    writers: ClassVar[Mapping[ModelFormat, Writer]] = {ModelFormat.DIFFUSERS: save_diffusers}

    def _prior_parts(self, model: LoadedModel) -> dict:
        """The components of the prior pipeline both variants write."""
        from diffusers import DDPMWuerstchenScheduler

        return {
            "prior": model.part("prior"),
            "text_encoder": model.part("text_encoder"),
            "tokenizer": model.text_encoders[0].tokenizer,
            "scheduler": DDPMWuerstchenScheduler(),
        }

    @abstractmethod
    def prior_pipeline(self, model: LoadedModel):
        """diffusers' prior pipeline over the live prior and its text encoder."""

    def save_backup(self, model: LoadedModel, folder: Path) -> None:
        self.save_diffusers(model, folder, torch.float32)

    # -- names ----------------------------------------------------------------------------------------------------

    def kohya_name(self, model: LoadedModel, part: str, module_path: str) -> str:
        return self.lora_file_name(model, part, module_path, ModelFormat.KOHYA_LORA)

    def _text_encoder_lora_name(self, module_path: str, legacy: bool) -> str:
        """The text encoder's modules: `lora_te_` (`lora_prior_te_` for `legacy`) over transformers' path."""
        return cascade_lora.text_encoder_lora_name(with_text_model(module_path), legacy)

    def metadata_kind(self, model: LoadedModel) -> ModelKind:
        return self.kind


class WuerstchenFamily(WuerstchenPriorFamily):
    """Würstchen v2: a WuerstchenPrior on shifted and scaled effnet latents, CLIP-H's hidden states; its decoder has
    a text encoder of its own."""

    info = WUERSTCHEN
    sampling_parts = frozenset(("prior", "text_encoder", "decoder", "decoder_text_encoder", "decoder_vqgan"))
    remap = staticmethod(wuerstchen_remap)
    kind = ModelKind("wuerstchen-v2-prior", "wuerstchen_2")
    channels_key = "c_in"

    def prior_class(self) -> type:
        from diffusers.pipelines.deprecated.wuerstchen import WuerstchenPrior

        return WuerstchenPrior

    def decoder_class(self) -> type:
        from diffusers.pipelines.deprecated.wuerstchen import WuerstchenDiffNeXt

        return WuerstchenDiffNeXt

    def text_encoder_class(self) -> type:
        from transformers import CLIPTextModel

        return CLIPTextModel

    def prior_from_file(self, path: Path, where: str, options: dict, dtype: torch.dtype) -> torch.nn.Module:
        raise ModelLoadError(
            f"prior.model_name: {path} is a single file; a Würstchen v2 prior is read from a diffusers folder or "
            "hub id (single stage C files are Stable Cascade's)"
        )

    def decoder_name(self, config: TrainConfig) -> str:
        return "warp-ai/wuerstchen"  # the released model's decoder

    def effnet_encoder(self, config: TrainConfig) -> torch.nn.Module:
        return _load_effnet(config, False)

    def load_decoder_extras(self, config, where, options, parts) -> object:
        """Würstchen's decoder has a text encoder of its own (CLIP-H), with its tokenizer."""
        from transformers import CLIPTextModel

        dtype = load_dtype(config, "decoder_text_encoder")
        parts["decoder_text_encoder"] = load_diffusers_component(
            CLIPTextModel, where, "text_encoder", options, dtype=dtype
        )
        return load_tokenizer(where, options)

    def text_conditioning(self, encoder: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> Conditioning:
        output = encoder(ids, attention_mask=mask)
        return Conditioning({"hidden_states": output.last_hidden_state, "attention_mask": mask})

    def to_prior_latents(self, latents: torch.Tensor) -> torch.Tensor:
        return effnet.to_wuerstchen_latents(latents)

    def from_prior_latents(self, latents: torch.Tensor) -> torch.Tensor:
        return effnet.from_wuerstchen_latents(latents)

    def predict(self, model, noisy_latents, timesteps, conditioning, extra) -> Prediction:
        prior = model.part("prior")
        dtype = first_weight(prior).dtype
        return Prediction(prior(noisy_latents.to(dtype), timesteps.to(dtype), conditioning.hidden_states.to(dtype)))

    def decoder_text(self, model: LoadedModel, prompt: str, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        text_encoder = model.part("decoder_text_encoder")
        ids, mask = self._tokens(
            model.family_state(WuerstchenState).decoder_tokenizer, [prompt], first_weight(text_encoder).device
        )
        return text_encoder(ids, attention_mask=mask).last_hidden_state.to(device, dtype)

    def decoder_step(self, decoder, x, ratio, effnet_latents, text) -> torch.Tensor:
        return decoder(x, ratio, effnet=effnet_latents, clip=text)

    def prior_pipeline(self, model: LoadedModel):
        from diffusers.pipelines.deprecated.wuerstchen import WuerstchenPriorPipeline

        return WuerstchenPriorPipeline(**self._prior_parts(model))

    def lora_file_name(self, model: LoadedModel, part: str, module_path: str, fmt: ModelFormat) -> str:
        """`lora_unet_<diffusers path>` for the prior, `lora_te_` for the text encoder, in either format."""
        if part == "prior":
            return "lora_unet_" + module_path.replace(".", "_")
        return self._text_encoder_lora_name(module_path, False)


class CascadeFamily(WuerstchenPriorFamily):
    """Stable Cascade: a StableCascadeUNet prior on the effnet's latents as they are, conditioned on CLIP-G's hidden
    states, its pooled embedding and a zero image embedding; the decoder reuses the prior's text encoder. Also
    written as Stability's stage C file."""

    info = CASCADE
    sampling_parts = frozenset(("prior", "text_encoder", "decoder", "decoder_vqgan"))
    remap = staticmethod(cascade_remap)
    kind = ModelKind("stable-cascade-v1-prior", "stable_cascade")
    channels_key = "in_channels"

    def prior_class(self) -> type:
        from diffusers import StableCascadeUNet

        return StableCascadeUNet

    decoder_class = prior_class  # stage B is a StableCascadeUNet too

    def text_encoder_class(self) -> type:
        from transformers import CLIPTextModelWithProjection

        return CLIPTextModelWithProjection

    def prior_from_file(self, path: Path, where: str, options: dict, dtype: torch.dtype) -> torch.nn.Module:
        """A single stage C file in Stability's layout (`stage_c.safetensors`, `stage_c_lite`) or diffusers', on the
        config it fits."""
        base_config = load_diffusers_component(self.prior_class(), where, "prior", options, config_only=True)
        return _stage_c_from_file(path, base_config, dtype)

    def decoder_name(self, config: TrainConfig) -> str:
        return "stabilityai/stable-cascade"  # the released model's decoder

    def effnet_encoder(self, config: TrainConfig) -> torch.nn.Module:
        return _load_effnet(config, True)

    def prior_autocast_dtype(self, config: TrainConfig) -> torch.dtype | None:
        """The Cascade prior gives NaN in float16: under a FLOAT_16 training dtype it computes in the fallback dtype
        (`fallback_train_dtype`)."""
        if config.train_dtype is not DataType.FLOAT_16:
            return None
        return torch_dtype(fallback_dtype(config.train_dtype, config.fallback_train_dtype))

    def text_conditioning(self, encoder: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> Conditioning:
        # clip_text: the last layer's hidden states without the final norm; clip_text_pooled: text_embeds.
        output = encoder(ids, attention_mask=mask, output_hidden_states=True)
        return Conditioning(
            {"hidden_states": output.hidden_states[-1], "pooled": output.text_embeds, "attention_mask": mask}
        )

    def predict(self, model, noisy_latents, timesteps, conditioning, extra) -> Prediction:
        prior = model.part("prior")
        dtype = first_weight(prior).dtype
        x = noisy_latents.to(dtype)
        ratio = timesteps.to(dtype)
        hidden = conditioning.hidden_states.to(dtype)
        pooled = conditioning.pooled.to(dtype)[:, None]
        clip_img = torch.zeros(len(x), 1, CLIP_IMAGE_WIDTH, device=x.device, dtype=dtype)
        clip_img = clip_img[..., : prior.config.clip_image_in_channels]
        with _prior_precision(x.device, model.family_state(WuerstchenState).prior_autocast):
            output = prior(x, ratio, clip_text_pooled=pooled, clip_text=hidden, clip_img=clip_img).sample
        return Prediction(output)

    def decoder_text(self, model: LoadedModel, prompt: str, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """The pooled embedding of the prior's text encoder."""
        slot = model.text_encoders[0]
        ids, mask = self._tokens(slot.tokenizer, [prompt], first_weight(slot.encoder).device)
        return slot.encoder(ids, attention_mask=mask).text_embeds[:, None].to(device, dtype)

    def decoder_step(self, decoder, x, ratio, effnet_latents, text) -> torch.Tensor:
        return decoder(x, ratio, clip_text_pooled=text, effnet=effnet_latents).sample

    def prior_pipeline(self, model: LoadedModel):
        from diffusers import StableCascadePriorPipeline

        return StableCascadePriorPipeline(**self._prior_parts(model), image_encoder=None, feature_extractor=None)

    def save_stage_c(
        self, model: LoadedModel, destination: Path, dtype: torch.dtype, extra_metadata: dict | None = None
    ) -> None:
        """The prior alone in Stability's stage C layout (fused attention), what ComfyUI and
        `StableCascadeUNet.from_single_file` load."""
        prior = model.part("prior")
        state = cascade_keys.to_stability(plain_state(prior), prior.config)
        metadata = model_file_metadata(self, model, destination, extra_metadata, resolution=1024)
        write_single_file(state, destination, dtype, metadata)

    writers: ClassVar[Mapping[ModelFormat, Writer]] = {
        ModelFormat.DIFFUSERS: WuerstchenPriorFamily.save_diffusers,
        ModelFormat.LEGACY_SAFETENSORS: save_stage_c,
    }

    def lora_file_name(self, model: LoadedModel, part: str, module_path: str, fmt: ModelFormat) -> str:
        """The prior: the native stage C path (split attention, as ComfyUI loads it), `lora_unet_` for KOHYA_LORA,
        `lora_prior_unet_` for LEGACY_LORA (ComfyUI's stage C map); the text encoder: `lora_te_` (`lora_prior_te_`
        for LEGACY_LORA)."""
        legacy = fmt is ModelFormat.LEGACY_LORA
        if part == "prior":
            return cascade_lora.prior_lora_name(module_path, legacy)
        return self._text_encoder_lora_name(module_path, legacy)


# ---------------------------------------------------------------------------------------------------------------------


def _prior_precision(device: torch.device, dtype: torch.dtype | None):
    """Leaves an active float16 autocast for `dtype` (float32: no autocast); anything else stays as it is."""
    fp16_autocast = torch.is_autocast_enabled(device.type) and torch.get_autocast_dtype(device.type) == torch.float16
    if dtype is None or not fp16_autocast:
        return contextlib.nullcontext()
    if dtype == torch.float32:
        return torch.autocast(device.type, enabled=False)
    return torch.autocast(device.type, dtype=dtype)


def _load_effnet(config: TrainConfig, cascade: bool) -> torch.nn.Module:
    name = config.part("effnet_encoder").model_name
    if not name:
        raise ModelLoadError(
            "effnet_encoder.model_name is empty: name the EfficientNet encoder file (Stable Cascade: "
            "effnet_encoder.safetensors from stabilityai/stable-cascade; Würstchen: warp-ai/EfficientNetEncoder)"
        )
    where = resolve_local(name)
    if not where.exists() and is_hub_id(name):
        where = _hub_effnet_file(ModelSource("hub", name), config)
    try:
        return effnet.load_encoder(where, load_dtype(config, "effnet_encoder"))
    except (FileNotFoundError, ValueError) as error:
        raise ModelLoadError(f"effnet_encoder.model_name: {error}") from error


def _hub_effnet_file(source, config: TrainConfig) -> Path:
    """The encoder's file from the hub cache, else downloaded (the repository's other files are not needed)."""
    from huggingface_hub import hf_hub_download, try_to_load_from_cache
    from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError

    from onetrainer.util.hub import cache_folder, offline_reason, probe, unavailable_message

    repo, cache_dir = source.location, config.huggingface_cache_dir or None
    folder = str(cache_folder(cache_dir))
    for filename in EFFNET_FILES:
        cached = try_to_load_from_cache(repo, filename, cache_dir=folder)
        if isinstance(cached, str):
            return Path(cached)
    what = "the EfficientNet encoder (effnet_encoder.model_name)"
    reason = offline_reason(config.offline_mode)
    if not reason:
        answer = probe(repo)
        reason = answer.reason if not answer.ok else ""
    if reason:
        raise ModelLoadError(unavailable_message(repo, cache_dir, reason, what))
    for filename in EFFNET_FILES:
        try:
            return Path(hf_hub_download(repo, filename, cache_dir=folder))
        except EntryNotFoundError:
            continue
        except (OSError, HfHubHTTPError) as error:
            raise ModelLoadError(unavailable_message(repo, cache_dir, str(error), what)) from error
    raise ModelLoadError(
        f"effnet_encoder.model_name: {repo} holds none of {', '.join(EFFNET_FILES)}: name the EfficientNet "
        "encoder's repository or a local .safetensors file"
    )


def _stage_c_from_file(path: Path, base_config: dict, dtype: torch.dtype) -> torch.nn.Module:
    """A stage C single file (prior.model_name) as a StableCascadeUNet on the config it fits, read in `dtype`."""
    from diffusers import StableCascadeUNet

    from onetrainer.weights.checkpoint_files import load_state_dict

    if path.suffix != ".safetensors":
        raise ModelLoadError(f"prior.model_name: {path} is not a .safetensors stage C file")
    try:
        state = load_state_dict(path, dtype)
    except Exception as error:  # safetensors raises its own error types for a damaged header
        raise ModelLoadError(f"prior.model_name: cannot read {path}: {error}") from error
    found = stage_c_config(state, base_config)
    if found is None:
        raise ModelLoadError(
            f"prior.model_name: {path} is no stage C model this trainer knows: it fits neither the base model's prior "
            "nor Stable Cascade's 3.6B or lite prior"
        )
    config, converted = found
    prior = empty_module(lambda: StableCascadeUNet.from_config(config))
    # built in float32 and the file's tensors copied in, before: the weights as that copy and the cast left them
    return assign_weights(prior, converted, dtype, f"the stage C file {path} (prior.model_name)", torch.float32)


def stage_c_config(state: dict[str, torch.Tensor], base_config: dict) -> tuple[dict, dict] | None:
    """The config a stage C state dict (Stability's layout or diffusers') fits, and the state in diffusers' names: the
    base model's prior, else the 3.6B or the lite prior (a lite file over the full-size prior pipeline, as
    OneTrainer's "Prior Model" override allows). None: it fits none of them."""
    from onetrainer.families.reference_configs import CASCADE_PRIOR_LITE_UNET, CASCADE_PRIOR_UNET

    stability = cascade_keys.is_stability_stage_c(state)
    for candidate in (base_config, CASCADE_PRIOR_UNET, CASCADE_PRIOR_LITE_UNET):
        try:
            converted = cascade_keys.to_diffusers(state, candidate) if stability else state
        except ValueError:
            continue
        if _fits(converted, candidate):
            return dict(candidate), converted
    return None


def _fits(state: dict[str, torch.Tensor], config: dict) -> bool:
    from diffusers import StableCascadeUNet

    with torch.device("meta"):
        expected = {k: v.shape for k, v in StableCascadeUNet.from_config(dict(config)).state_dict().items()}
    return expected.keys() == state.keys() and all(state[k].shape == shape for k, shape in expected.items())
