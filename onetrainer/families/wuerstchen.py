"""Würstchen v2 and Stable Cascade: the prior (stage C) is trained on EfficientNet latents; the decoder (stage B) and
the VQGAN (stage A) only render samples. One family class, two variants that differ in the prior's class, its text
conditioning and the latent scaling.

The public warp-ai folders do not load as a diffusers pipeline (their model_index.json names the library
`wuerstchen`), so every part loads from its own subfolder.
"""

from __future__ import annotations

import contextlib
import math
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from PIL import Image

from onetrainer.config.enums import ModelFormat, ModelType
from onetrainer.config.model_types import CASCADE, WUERSTCHEN
from onetrainer.families import effnet
from onetrainer.families.base import (
    CaptionDropout,
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
from onetrainer.families.sd_common import plain_state, save_pipeline_folder
from onetrainer.families.sources import ModelSource, is_hub_id, resolve_local, resolve_source
from onetrainer.noise.cosine import ContinuousCosineSchedule
from onetrainer.noise.prediction import Prediction
from onetrainer.util.fs import atomic_file
from onetrainer.weights import cascade_keys, cascade_lora
from onetrainer.weights.metadata import ModelKind, model_metadata

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


def is_cascade(model_type: ModelType) -> bool:
    return model_type is ModelType.STABLE_CASCADE_1


class WuerstchenFamily(Family):
    """Both variants; `info` is Würstchen's, `CascadeFamily` changes the declarations."""

    info = WUERSTCHEN
    caption_dropout = CaptionDropout.EMPTY_CAPTION
    sampling_parts = frozenset(("prior", "text_encoder", "decoder", "decoder_text_encoder", "decoder_vqgan"))
    broken_sample_advice = (
        "set the decoder's and its VQGAN's weight data types (decoder.weight_dtype, decoder_vqgan.weight_dtype) to "
        "FLOAT_32 or BFLOAT_16"
    )

    # -- loading --------------------------------------------------------------------------------------------------

    def load(self, config: TrainConfig) -> LoadedModel:
        cascade = is_cascade(config.model_type)
        source = resolve_source(config.base_model_name)
        if source.kind == "backup":
            from onetrainer.families.sd import _backup_model_dir

            source = ModelSource("diffusers", str(_backup_model_dir(source.path)))
        if source.kind not in ("diffusers", "hub"):
            raise ModelLoadError(
                f"{config.base_model_name}: load {self.info.label} from a diffusers prior folder or hub id"
            )
        options = hub_options(source, config, file_sets=self.info.hub_file_sets)
        where = source.location
        parts = {"prior": self._load_prior(config, where, options, cascade)}
        text_cls = _text_encoder_class(cascade)
        parts["text_encoder"] = load_diffusers_component(text_cls, where, "text_encoder", options)
        tokenizer = load_tokenizer(where, options)
        decoder_parts, decoder_tokenizer = self._load_decoder(config, cascade)
        parts.update(decoder_parts)
        parts["effnet_encoder"] = _load_effnet(config, cascade)
        for module in parts.values():
            module.requires_grad_(False)
        cast_parts(parts, config)
        slot = TextEncoderSlot("text_encoder", parts["text_encoder"], tokenizer, "lora_te", "clip_g")
        schedule = ContinuousCosineSchedule(cascade_remap if cascade else wuerstchen_remap)
        extra = {"decoder_tokenizer": decoder_tokenizer, "prior_autocast": _prior_autocast(config, cascade)}
        return LoadedModel(config.model_type, parts, [slot], schedule, config.base_model_name, extra)

    def _load_prior(self, config: TrainConfig, where: str, options: dict, cascade: bool) -> torch.nn.Module:
        """The base's prior, or the prior part's own model (`prior.model_name`): a diffusers folder or hub id, or
        (Stable Cascade) a single stage C file in Stability's layout (`stage_c.safetensors`, `stage_c_lite`) or
        diffusers'."""
        if cascade:
            from diffusers import StableCascadeUNet as cls
        else:
            from diffusers.pipelines.deprecated.wuerstchen import WuerstchenPrior as cls
        override = config.part("prior").model_name.strip()
        if not override:
            return load_diffusers_component(cls, where, "prior", options)
        path = resolve_local(override)
        if not path.exists() and is_hub_id(override):
            files = self.info.part_hub_file_sets["prior"]
            options = hub_options(ModelSource("hub", override), config, "the prior (prior.model_name)", files)
            return load_diffusers_component(cls, override, "prior", options)
        if path.is_dir():
            subfolder = "prior" if (path / "prior" / "config.json").is_file() else None
            return load_diffusers_component(cls, str(path), subfolder, {"local_files_only": True})
        if not path.is_file():
            raise ModelLoadError(f"the prior's model (prior.model_name) was not found: {override}")
        if not cascade:
            raise ModelLoadError(
                f"prior.model_name: {path} is a single file; a Würstchen v2 prior is read from a diffusers folder or "
                "hub id (single stage C files are Stable Cascade's)"
            )
        base_config = load_diffusers_component(cls, where, "prior", options, config_only=True)
        return _stage_c_from_file(path, base_config)

    def _load_decoder(self, config: TrainConfig, cascade: bool) -> tuple[dict[str, torch.nn.Module], object]:
        name = config.part("decoder").model_name or _default_decoder(cascade)
        source = resolve_source(name)
        files = self.info.part_hub_file_sets["decoder"]
        options = hub_options(source, config, "the decoder (decoder.model_name)", files)
        where = source.location
        if cascade:
            from diffusers import StableCascadeUNet as decoder_cls
            from diffusers.pipelines.deprecated.wuerstchen import PaellaVQModel
        else:
            from diffusers.pipelines.deprecated.wuerstchen import PaellaVQModel
            from diffusers.pipelines.deprecated.wuerstchen import WuerstchenDiffNeXt as decoder_cls
        parts = {
            "decoder": load_diffusers_component(decoder_cls, where, "decoder", options),
            "decoder_vqgan": load_diffusers_component(PaellaVQModel, where, "vqgan", options),
        }
        tokenizer = None
        if not cascade:  # Würstchen's decoder has a text encoder of its own (CLIP-H); Cascade's reuses the prior's
            from transformers import CLIPTextModel

            parts["decoder_text_encoder"] = load_diffusers_component(CLIPTextModel, where, "text_encoder", options)
            tokenizer = load_tokenizer(where, options)
        return parts, tokenizer

    # -- text and images ------------------------------------------------------------------------------------------

    def _tokens(self, tokenizer, captions: list[str], device) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = tokenizer(captions, padding="max_length", max_length=TOKENS, truncation=True, return_tensors="pt")
        return tokens.input_ids.to(device), tokens.attention_mask.to(device)

    def encode_text(self, model: LoadedModel, captions: list[str]) -> Conditioning:
        slot = model.text_encoders[0]
        encoder = slot.encoder
        ids, mask = self._tokens(slot.tokenizer, captions, first_weight(encoder).device)
        if is_cascade(model.model_type):
            # clip_text: the last layer's hidden states without the final norm; clip_text_pooled: text_embeds.
            output = encoder(ids, attention_mask=mask, output_hidden_states=True)
            return Conditioning(
                {"hidden_states": output.hidden_states[-1], "pooled": output.text_embeds, "attention_mask": mask}
            )
        output = encoder(ids, attention_mask=mask)
        return Conditioning({"hidden_states": output.last_hidden_state, "attention_mask": mask})

    def encode_images(self, model: LoadedModel, pixels: torch.Tensor) -> torch.Tensor:
        encoder = model.part("effnet_encoder")
        weight = first_weight(encoder)
        images = ((pixels.float() + 1) / 2).clamp(0, 1).to(weight.device)
        # Outside any fp16 autocast: the effnet's batch norms overflow in half precision.
        with torch.autocast(weight.device.type, enabled=False):
            latents = effnet.encode(encoder, images, not is_cascade(model.model_type))
        return latents.float()

    # -- a training step ------------------------------------------------------------------------------------------

    def predict(self, model, noisy_latents, timesteps, conditioning, extra) -> Prediction:
        prior = model.part("prior")
        dtype = first_weight(prior).dtype
        x = noisy_latents.to(dtype)
        ratio = timesteps.to(dtype)
        hidden = conditioning.hidden_states.to(dtype)
        if not is_cascade(model.model_type):
            return Prediction(prior(x, ratio, hidden))
        pooled = conditioning.pooled.to(dtype)[:, None]
        clip_img = torch.zeros(len(x), 1, CLIP_IMAGE_WIDTH, device=x.device, dtype=dtype)
        clip_img = clip_img[..., : prior.config.clip_image_in_channels]
        # The Cascade prior gives NaN in float16: under a FLOAT_16 training dtype it computes in the fallback dtype.
        with _prior_precision(x.device, model.extra.get("prior_autocast")):
            output = prior(x, ratio, clip_text_pooled=pooled, clip_text=hidden, clip_img=clip_img).sample
        return Prediction(output)

    # -- sampling -------------------------------------------------------------------------------------------------

    def _scheduler(self, model: LoadedModel, steps: int):
        from diffusers import DDPMWuerstchenScheduler

        scheduler = DDPMWuerstchenScheduler()
        scheduler.set_timesteps(steps, device=first_weight(model.part("prior")).device)
        return scheduler

    def sample(self, model: LoadedModel, sample, apply_embeddings, zero_terminal_snr: bool) -> Image.Image:
        """Prior (CFG) → decoder (10 steps, no CFG) → VQGAN."""
        cascade = is_cascade(model.model_type)
        prior = model.part("prior")
        device = first_weight(prior).device
        generator = torch.Generator().manual_seed(sample.seed)
        positive = self.encode_text(model, [apply_embeddings(sample.prompt)])
        negative = self.encode_text(model, [apply_embeddings(sample.negative_prompt or "")])
        height = math.ceil(sample.height / PRIOR_RESOLUTION_MULTIPLE)
        width = math.ceil(sample.width / PRIOR_RESOLUTION_MULTIPLE)
        channels = prior.config.in_channels if cascade else prior.config.c_in
        latents = torch.randn((1, channels, height, width), generator=generator).to(device)
        scheduler = self._scheduler(model, sample.diffusion_steps)
        for t in scheduler.timesteps[:-1]:
            ratio = t.view(1).to(device)
            eps = self.predict(model, latents, ratio, positive, {}).output.float()
            if sample.cfg_scale != 1.0:
                uncond = self.predict(model, latents, ratio, negative, {}).output.float()
                eps = uncond + sample.cfg_scale * (eps - uncond)
            latents = scheduler.step(eps, ratio, latents).prev_sample
        effnet_latents = latents if cascade else effnet.from_wuerstchen_latents(latents)
        return self._decode(model, effnet_latents, sample, generator)

    def _decode(self, model: LoadedModel, effnet_latents: torch.Tensor, sample, generator) -> Image.Image:
        cascade = is_cascade(model.model_type)
        decoder = model.part("decoder")
        weight = first_weight(decoder)
        device, dtype = weight.device, weight.dtype
        if cascade:
            slot = model.text_encoders[0]
            ids, mask = self._tokens(slot.tokenizer, [sample.prompt], first_weight(slot.encoder).device)
            pooled = slot.encoder(ids, attention_mask=mask).text_embeds[:, None].to(device, dtype)
        else:
            text_encoder = model.part("decoder_text_encoder")
            tokenizer = model.extra["decoder_tokenizer"]
            ids, mask = self._tokens(tokenizer, [sample.prompt], first_weight(text_encoder).device)
            clip = text_encoder(ids, attention_mask=mask).last_hidden_state.to(device, dtype)
        height = int(effnet_latents.shape[2] * DECODER_LATENT_SCALE)
        width = int(effnet_latents.shape[3] * DECODER_LATENT_SCALE)
        channels = decoder.config.in_channels if cascade else decoder.config.c_in
        x = torch.randn((1, channels, height, width), generator=generator).to(device, dtype)
        effnet_latents = effnet_latents.to(device, dtype)
        scheduler = self._scheduler(model, DECODER_STEPS)
        for t in scheduler.timesteps[:-1]:
            ratio = t.view(1).to(device, dtype)
            if cascade:
                out = decoder(x, ratio, clip_text_pooled=pooled, effnet=effnet_latents).sample
            else:
                out = decoder(x, ratio, effnet=effnet_latents, clip=clip)
            x = scheduler.step(out.float(), t.view(1), x.float()).prev_sample.to(dtype)
        vqgan = model.part("decoder_vqgan")
        vq_weight = first_weight(vqgan)
        scale = vqgan.config.scale_factor
        pixels = vqgan.decode(x.to(vq_weight.device, vq_weight.dtype) * scale).sample.clamp(0, 1)
        array = (pixels[0].float().permute(1, 2, 0).cpu().numpy() * 255).round().clip(0, 255).astype(np.uint8)
        return Image.fromarray(array)

    # -- saving ---------------------------------------------------------------------------------------------------

    def save(
        self, model: LoadedModel, fmt: ModelFormat, destination: Path, dtype: torch.dtype, metadata: dict | None = None
    ) -> None:
        if fmt is ModelFormat.DIFFUSERS:
            self.save_diffusers(model, destination, dtype)
        elif fmt is ModelFormat.LEGACY_SAFETENSORS and is_cascade(model.model_type):
            self.save_stage_c(model, destination, dtype, metadata)
        else:
            raise ValueError(f"{fmt.value} is not a fine-tune format of {self.info.label}")

    def save_stage_c(
        self, model: LoadedModel, destination: Path, dtype: torch.dtype, extra_metadata: dict | None = None
    ) -> None:
        """The prior alone in Stability's stage C layout (fused attention), what ComfyUI and
        `StableCascadeUNet.from_single_file` load."""
        from safetensors.torch import save_file

        prior = model.part("prior")
        state = cascade_keys.to_stability(plain_state(prior), prior.config)
        state = {k: v.detach().to("cpu", dtype).contiguous() for k, v in state.items()}
        metadata = model_metadata(self.metadata_kind(model), Path(destination).stem, (1024, 1024), False)
        metadata.update(extra_metadata or {})
        with atomic_file(destination) as tmp:
            save_file(state, str(tmp), metadata=metadata)

    def save_diffusers(self, model: LoadedModel, destination: Path, dtype: torch.dtype) -> None:
        """The prior pipeline folder (prior, text encoder, tokenizer, scheduler) that diffusers writes."""
        save_pipeline_folder(self._prior_pipeline(model), destination, dtype)

    def _prior_pipeline(self, model: LoadedModel):
        from diffusers import DDPMWuerstchenScheduler

        parts = {
            "prior": model.part("prior"),
            "text_encoder": model.part("text_encoder"),
            "tokenizer": model.text_encoders[0].tokenizer,
            "scheduler": DDPMWuerstchenScheduler(),
        }
        if is_cascade(model.model_type):
            from diffusers import StableCascadePriorPipeline

            return StableCascadePriorPipeline(**parts, image_encoder=None, feature_extractor=None)
        from diffusers.pipelines.deprecated.wuerstchen import WuerstchenPriorPipeline

        return WuerstchenPriorPipeline(**parts)

    def save_backup(self, model: LoadedModel, folder: Path) -> None:
        self.save_diffusers(model, folder, torch.float32)

    # -- names ----------------------------------------------------------------------------------------------------

    def kohya_name(self, model: LoadedModel, part: str, module_path: str) -> str:
        return self.lora_file_name(model, part, module_path, ModelFormat.KOHYA_LORA)

    def lora_file_name(self, model: LoadedModel, part: str, module_path: str, fmt: ModelFormat) -> str:
        """Würstchen: `lora_unet_<diffusers path>`. Stable Cascade: the native stage C path (split attention, as
        ComfyUI loads it), `lora_unet_` for KOHYA_LORA, `lora_prior_unet_` for LEGACY_LORA (ComfyUI's stage C map).
        The text encoder: `lora_te_` (`lora_prior_te_` for Cascade's LEGACY_LORA) over transformers' path."""
        legacy = fmt is ModelFormat.LEGACY_LORA and is_cascade(model.model_type)
        if part == "prior":
            if is_cascade(model.model_type):
                return cascade_lora.prior_lora_name(module_path, legacy)
            return "lora_unet_" + module_path.replace(".", "_")
        body = module_path if module_path.startswith("text_model.") else "text_model." + module_path
        return cascade_lora.text_encoder_lora_name(body, legacy)

    def metadata_kind(self, model: LoadedModel) -> ModelKind:
        if is_cascade(model.model_type):
            return ModelKind("stable-cascade-v1-prior", "stable_cascade")
        return ModelKind("wuerstchen-v2-prior", "wuerstchen_2")


class CascadeFamily(WuerstchenFamily):
    info = CASCADE
    sampling_parts = frozenset(("prior", "text_encoder", "decoder", "decoder_vqgan"))


# ---------------------------------------------------------------------------------------------------------------------


def _text_encoder_class(cascade: bool):
    from transformers import CLIPTextModel, CLIPTextModelWithProjection

    return CLIPTextModelWithProjection if cascade else CLIPTextModel


def _prior_autocast(config: TrainConfig, cascade: bool) -> torch.dtype | None:
    """The autocast dtype of the Cascade prior when training in FLOAT_16 (`fallback_train_dtype`), else None."""
    from onetrainer.config.enums import DataType
    from onetrainer.training.devices import fallback_dtype
    from onetrainer.util.dtypes import torch_dtype

    if not cascade or config.train_dtype is not DataType.FLOAT_16:
        return None
    return torch_dtype(fallback_dtype(config))


def _prior_precision(device: torch.device, dtype: torch.dtype | None):
    """Leaves an active float16 autocast for `dtype` (float32: no autocast); anything else stays as it is."""
    fp16_autocast = torch.is_autocast_enabled(device.type) and torch.get_autocast_dtype(device.type) == torch.float16
    if dtype is None or not fp16_autocast:
        return contextlib.nullcontext()
    if dtype == torch.float32:
        return torch.autocast(device.type, enabled=False)
    return torch.autocast(device.type, dtype=dtype)


def _default_decoder(cascade: bool) -> str:
    """The decoder of the released model, where the config names none."""
    hub = "stabilityai/stable-cascade" if cascade else "warp-ai/wuerstchen"
    return hub


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
        return effnet.load_encoder(where)
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


def _stage_c_from_file(path: Path, base_config: dict) -> torch.nn.Module:
    """A stage C single file (prior.model_name) as a StableCascadeUNet on the config it fits."""
    from diffusers import StableCascadeUNet
    from safetensors.torch import load_file

    if path.suffix != ".safetensors":
        raise ModelLoadError(f"prior.model_name: {path} is not a .safetensors stage C file")
    try:
        state = load_file(str(path))
    except Exception as error:  # safetensors raises its own error types for a damaged header
        raise ModelLoadError(f"prior.model_name: cannot read {path}: {error}") from error
    found = stage_c_config(state, base_config)
    if found is None:
        raise ModelLoadError(
            f"prior.model_name: {path} is no stage C model this trainer knows: it fits neither the base model's prior "
            "nor Stable Cascade's 3.6B or lite prior"
        )
    config, converted = found
    prior = StableCascadeUNet.from_config(config)
    checked_load(prior, converted, f"the stage C file {path} (prior.model_name)")
    return prior


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
