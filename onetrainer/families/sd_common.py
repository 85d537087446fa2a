"""What Stable Diffusion 1.x / 2.x and SDXL share: their base class (`StableDiffusionBase`: the source dispatch, the
VAE image encoding, inpainting's cached inputs and sample arguments, sampling through the pipeline, saving),
single-file key prefixes and converters, the CLIP text-encoder config and tokenizer of single files. The inpainting
inputs are `inpainting.py`'s."""

from __future__ import annotations

import json
import logging
from abc import abstractmethod
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import torch

from onetrainer.config.enums import ModelFormat, ModelType
from onetrainer.config.model_types import model_type_info
from onetrainer.families import reference_configs as reference
from onetrainer.families.base import Family, LoadedModel, Writer
from onetrainer.families.inpainting import inpainting_cache, inpainting_sample_inputs
from onetrainer.families.loading import KeptParts, backup_model_source
from onetrainer.families.saving import model_file_metadata, save_pipeline_folder, write_single_file
from onetrainer.families.sources import ModelSource, cache_root, resolve_source
from onetrainer.families.vae import encode_latents
from onetrainer.util.threads import library_attribute

if TYPE_CHECKING:
    from onetrainer.config import TrainConfig

log = logging.getLogger(__name__)

UNET_PREFIX = "model.diffusion_model."
TEXT_PREFIX = "cond_stage_model."
CONFIGS_KEY = "onetrainer.diffusers_configs"  # the component configs, embedded in single files we write
TOKENIZER_KEY = "onetrainer.tokenizer"  # a tokenizer other than the standard CLIP one, embedded likewise


class StableDiffusionBase(Family):
    """What the SD 1.x / 2.x and SDXL families do alike: where the base model is read from, the VAE's image encoding,
    inpainting's cached inputs and sample arguments, sampling through the family's pipeline, and saving (a diffusers
    folder, or one original single file from the family's `original_state_dict`). Each family subclasses it."""

    saved_scheduler: ClassVar[str]  # the sampler a saved diffusers folder names (what the model's authors ship)

    # -- loading --------------------------------------------------------------------------------------------------

    def read_source(self, config: TrainConfig, parts: KeptParts):
        """The base model's parts, wherever it is, added to `parts`; returns its tokenizer(s), scheduler config and
        the family's state (`FamilyState`)."""
        source = resolve_source(config.base_model_name)
        if source.kind == "single_file":
            # The whole file is in memory while its parts are built: they are put in their form once it is let go.
            file_parts, *rest = self.load_single_file(source.path, config)
            parts.update(file_parts)
            return rest
        if source.kind == "backup":
            source = backup_model_source(source.path)
        return self.load_diffusers(source, config, parts)

    @abstractmethod
    def load_single_file(self, path: Path, config: TrainConfig):
        """The parts, tokenizer(s), scheduler config and the family's state from an original single file, each part
        read in its `loading.load_dtype`."""

    @abstractmethod
    def load_diffusers(self, source: ModelSource, config: TrainConfig, parts: KeptParts):
        """The same from a diffusers folder or hub id, each part added to `parts` as it is read (in declared order);
        returns the rest."""

    # -- images ---------------------------------------------------------------------------------------------------

    def encode_images(self, model: LoadedModel, pixels: torch.Tensor) -> torch.Tensor:
        return encode_latents(model.part("vae"), pixels)

    def cache_extras(
        self, model: LoadedModel, pixels: torch.Tensor, masks: torch.Tensor | None, depths: list | None = None
    ) -> dict:
        if not model.type_info.inpainting or masks is None:
            return {}
        return inpainting_cache(self, model, pixels, masks)

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

    # -- saving ---------------------------------------------------------------------------------------------------

    def save_diffusers(
        self, model: LoadedModel, destination: Path, dtype: torch.dtype, metadata: dict | None = None
    ) -> None:
        """The diffusers pipeline folder (`metadata`, a single file's header entries, has no place in it)."""
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

    @abstractmethod
    def original_state_dict(self, model: LoadedModel, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        """The whole model in the original key layout, as A1111, Forge and ComfyUI read it, in `dtype`."""

    def save_single_file(
        self, model: LoadedModel, destination: Path, dtype: torch.dtype, extra_metadata: dict | None = None
    ) -> None:
        state = self.original_state_dict(model, dtype)
        metadata = model_file_metadata(self, model, destination)
        metadata[CONFIGS_KEY] = json.dumps({name: _config_of(part) for name, part in model.parts.items()}, default=str)
        tokenizer = model.text_encoders[0].tokenizer
        if len(tokenizer) != 49408:
            # Only a tokenizer other than CLIP's standard one (49408 tokens) travels inside the file: a reader has the
            # standard one, not another vocabulary.
            metadata[TOKENIZER_KEY] = json.dumps({"vocab": tokenizer.get_vocab(), "merges": merges_of(tokenizer)})
        metadata.update(extra_metadata or {})
        write_single_file(state, destination, dtype, metadata)

    writers: ClassVar[Mapping[ModelFormat, Writer]] = {
        ModelFormat.DIFFUSERS: save_diffusers,
        ModelFormat.ORIGINAL_SINGLE_FILE: save_single_file,
        ModelFormat.LEGACY_SAFETENSORS: save_single_file,
    }


def _config_of(part: torch.nn.Module) -> dict:
    """A part's config as plain data: diffusers models keep a frozen dict, transformers models a config object."""
    config = part.config
    return config.to_dict() if hasattr(config, "to_dict") else dict(config)


def unet_conv_input_sizes(unet: torch.nn.Module, vae: torch.nn.Module, height: int, width: int) -> dict:
    """The (height, width) of each Conv2d's input in a diffusers UNet trained on `height` × `width` pixel images.

    The UNet's own forward runs on a copy built on the meta device (shapes only: no memory, no compute), so every
    level's size comes out as the real model computes it, odd sizes included. Empty if the copy cannot run.
    """
    scale = 2 ** (len(vae.config.block_out_channels) - 1)
    config = unet.config
    with torch.device("meta"):
        probe = type(unet).from_config(config)
    sizes: dict[str, tuple[int, int]] = {}

    def record(name: str):
        def hook(_layer, args) -> None:  # a pre-hook that returned something would replace the layer's input
            sizes.setdefault(name, tuple(args[0].shape[-2:]))

        return hook

    for name, layer in probe.named_modules():
        if isinstance(layer, torch.nn.Conv2d):
            layer.register_forward_pre_hook(record(name))
    meta = torch.device("meta")
    sample = torch.empty(1, config.in_channels, max(1, height // scale), max(1, width // scale), device=meta)
    hidden = torch.empty(1, 77, config.cross_attention_dim, device=meta)
    kwargs = {}
    if config.addition_embed_type == "text_time":  # SDXL: pooled text and the six size / crop ids
        pooled = config.projection_class_embeddings_input_dim - 6 * config.addition_time_embed_dim
        kwargs["added_cond_kwargs"] = {
            "text_embeds": torch.empty(1, pooled, device=meta),
            "time_ids": torch.empty(1, 6, device=meta),
        }
    try:
        with torch.no_grad():
            probe(sample, torch.zeros(1, dtype=torch.long, device=meta), hidden, **kwargs)
    except (RuntimeError, TypeError, ValueError, NotImplementedError) as e:
        # A UNet variant the probe does not know how to feed: nothing is left out, and the log says why.
        log.warning("the conv input sizes of this UNet could not be worked out (%s: %s)", type(e).__name__, e)
        return {}
    return sizes


def wants_v_prediction(config: TrainConfig, model_type: ModelType) -> bool:
    """v-prediction: forced by the config (zero terminal SNR needs it), else the model type's."""
    if config.force_epsilon_prediction:
        return False
    if config.force_v_prediction or config.rescale_noise_scheduler_to_zero_terminal_snr:
        return True
    return model_type_info(model_type).v_prediction


def clip_config(config: dict) -> dict:
    return {
        k: v for k, v in config.items() if not k.startswith("_") and k not in ("architectures", "transformers_version")
    }


def convert_text_encoder(state: dict, text_encoder, v2: bool) -> dict:
    from diffusers.loaders.single_file_utils import convert_ldm_clip_checkpoint, convert_open_clip_checkpoint

    if v2:
        converted = convert_open_clip_checkpoint(text_encoder, state, prefix=TEXT_PREFIX + "model.")
    else:
        converted = convert_ldm_clip_checkpoint(state)
    # transformers 5 names CLIPTextModel's weights without the `text_model.` level the converters produce.
    own = set(text_encoder.state_dict())
    out = {}
    for key, value in converted.items():
        short = key[len("text_model.") :] if key.startswith("text_model.") else key
        if short in own:
            out[short] = value
        elif key in own:
            out[key] = value
    return out


def single_file_tokenizer(metadata: dict, v2: bool):
    pad = reference.OPEN_CLIP_TOKENIZER["pad_token"] if v2 else reference.CLIP_TOKENIZER["pad_token"]
    if TOKENIZER_KEY in metadata:
        import tempfile

        from transformers import CLIPTokenizer

        data = json.loads(metadata[TOKENIZER_KEY])
        with tempfile.TemporaryDirectory(prefix="onetrainer-tokenizer-") as tmp:
            folder = Path(tmp)
            (folder / "vocab.json").write_text(json.dumps(data["vocab"]), encoding="utf-8")
            (folder / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{m}\n" for m in data["merges"]), "utf-8")
            config = {**reference.CLIP_TOKENIZER, "pad_token": pad}
            (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
            return CLIPTokenizer.from_pretrained(str(folder))
    from onetrainer.families.clip_tokenizer import load_clip_tokenizer

    return load_clip_tokenizer(cache_root(), pad)


def merges_of(tokenizer) -> list[str]:
    merges = json.loads(tokenizer.backend_tokenizer.to_str())["model"]["merges"]
    return [m if isinstance(m, str) else " ".join(m) for m in merges]


def schedule_markers(model: LoadedModel) -> dict[str, torch.Tensor]:
    """Empty tensors that tell other tools how the model was trained, where the file's weights cannot: `v_pred`
    (ComfyUI for SDXL; A1111/Forge for SDXL and SD 2.x) and `ztsnr`, zero terminal SNR (ComfyUI with `v_pred`, A1111
    and Forge). SD 1.x files are read as epsilon whatever they carry: see docs/outputs.md."""
    markers = {}
    if model.v_prediction:
        markers["v_pred"] = torch.tensor([])
    if getattr(model.schedule, "zero_terminal_snr", False):
        markers["ztsnr"] = torch.tensor([])
    return markers
