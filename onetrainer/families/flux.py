"""Flux.1 (dev, schnell, Fill, Kontext) and Chroma: a transformer of double-stream blocks (image and text apart, joint
attention) and single-stream blocks over 2x2-packed 16-channel VAE latents, trained by rectified flow.

`FluxTransformerFamily` is what both do alike; `FluxFamily` (FLUX_DEV_1, FLUX_FILL_DEV_1) and `ChromaFamily`
(CHROMA_1) each override what differs (`FluxKontextFamily`, FLUX_KONTEXT_DEV_1, extends Flux's with a reference
image's tokens): the text encoders and their conditioning, the transformer's other inputs,
the pipeline.

- Latents: the VAE's, shifted and scaled ((z - shift)·scale, `vae.encode_latents`), packed 2x2 into tokens with
  (0, row, column) position ids for the rotary embedding; the text tokens' ids are zeros. Training and sample sizes go
  in steps of 16 px.
- The noise schedule is `noise/flow_matching.FlowMatchingSchedule` on the model's own scheduler config (x_t =
  (1 − σ)·x0 + σ·ε, target ε − x0, the training shift by `timestep_shift` or by the resolution); the trainer hands
  `predict` the schedule's model time σ·T and the transformer takes σ (diffusers' pipelines pass timestep / 1000).
- Flux: CLIP-L's pooled output and T5-XXL's hidden states (512 tokens, 256 for schnell; T5 sees no attention mask,
  as in BFL's and diffusers' code; `transformer.attention_mask` zeroes the padding's states); dev and Fill take a
  guidance value (`guidance_embeds`), in training the fixed `transformer.guidance_scale`, in samples the distilled
  guidance (the sample's CFG scale; no unconditioned pass).
  schnell is the same model type without the guidance input. Fill (an inpainting model type) also takes the masked
  image's latents and the mask, its 8x8 pixels per latent as 64 channels (`F.pixel_unshuffle`), concatenated with
  the noisy latents before packing.
- Chroma: T5 alone, with its attention mask, which also masks the transformer's attention to the padding (all but
  its first token); training trims the padding no caption of the batch uses. Samples use real CFG with the negative
  prompt.
- Caption dropout zeroes each text encoder's share on its own draw (CLIP's pooled output, T5's hidden states), the
  attention masks kept, as OneTrainer does.
- Sampling goes through diffusers' pipelines with our prompt embeddings (so embeddings and clip skip apply); saving
  writes the diffusers pipeline folder (also the backup, usable as a base model), or the transformer alone in Black
  Forest Labs' layout (ORIGINAL_TRANSFORMER, `weights/flux_keys.py`), which `transformer.model_name` also reads over
  a diffusers base.
- LoRA files: DIFFUSERS_LORA (peft names), or KOHYA_LORA over the original names (`weights/flux_lora.py`: q/k/v and
  linear1 as exact fused LoRAs; CLIP `lora_te1_`, Flux's T5 `lora_te3_` as sd-scripts, Chroma's T5 `lora_te1_`);
  reading also takes OneTrainer's `lora_transformer_…`, `lora_te2_` (Flux's T5) and `lora_te_` (Chroma's T5).
"""

from __future__ import annotations

import dataclasses
import math
from abc import abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import torch
import torch.nn.functional as F

from onetrainer.config.enums import GGUF_WEIGHT_DTYPES, ModelFormat
from onetrainer.config.model_types import SampleDefaults
from onetrainer.config.parts import NEEDS_GGUF_DTYPE, is_gguf_file
from onetrainer.families.base import (
    BatchInputs,
    CaptionDropout,
    Conditioning,
    Family,
    FamilyState,
    LoadedModel,
    TextEncoderSlot,
    Writer,
    first_weight,
)
from onetrainer.families.flux_info import CHROMA, FLUX, FLUX_KONTEXT
from onetrainer.families.inpainting import inpainting_cache, inpainting_inputs, inpainting_sample_inputs
from onetrainer.families.latent_patches import PATCH, pack, unpack
from onetrainer.families.loading import (
    KeptParts,
    ModelLoadError,
    assign_weights,
    check_inpainting,
    empty_module,
    file_reading,
    load_diffusers_component,
    load_dtype,
    load_tokenizer,
    part_wise_base,
    read_pretrained,
)
from onetrainer.families.saving import FlowPipelineFolder, model_file_metadata, plain_state, write_single_file
from onetrainer.families.sources import resolve_local
from onetrainer.families.text_encoding import t5_hidden_states
from onetrainer.families.vae import encode_latents, load_vae
from onetrainer.noise.prediction import Prediction
from onetrainer.weights import flux_keys, flux_lora, kohya_lora
from onetrainer.weights.clip_names import file_module_path
from onetrainer.weights.metadata import ModelKind

if TYPE_CHECKING:
    from onetrainer.config import TrainConfig

VAE_FACTOR = 8  # image pixels per latent pixel
CLIP_TOKENS = 77
T5_TOKENS = 512
SCHNELL_T5_TOKENS = 256  # what FLUX.1-schnell is prompted with
SCHNELL_SAMPLE_STEPS = 4
CHROMA_MASK_STEP = 16  # Chroma's text is trimmed to a multiple of this many tokens (as OneTrainer pads it)
DEFAULT_TRAIN_STEPS = 1000  # the schedule's T where a model's scheduler config does not say
DEV_KIND = ModelKind("flux-1-dev", "flux1")
SCHNELL_KIND = ModelKind("flux-1-schnell", "flux1")
FILL_KIND = ModelKind("flux-1-fill-dev", "flux1")
KONTEXT_KIND = ModelKind("flux-1-kontext-dev", "flux1")
CHROMA_KIND = ModelKind("chroma", "chroma")


@dataclass(slots=True)
class FluxState(FamilyState):
    """What a Flux / Chroma model keeps besides its parts: the schedule's T (`num_train_timesteps` of its scheduler
    config), the guidance value the transformer is trained with (`transformer.guidance_scale`; dev and Fill take one),
    and whether the T5 padding's hidden states are zeroed (`transformer.attention_mask`)."""

    train_steps: int = DEFAULT_TRAIN_STEPS
    guidance: float = 1.0
    mask_padding: bool = False


class FluxTransformerFamily(FlowPipelineFolder, Family):
    """What Flux and Chroma do alike: part-wise loading from a diffusers folder or hub id (or a backup), T5, the VAE's
    shifted latents, packing, the flow-matching schedule, the transformer call, sampling through the variant's
    pipeline, the pipeline folder. Each variant declares its facts and overrides the methods marked abstract; the hooks
    a variant may override are listed in `families/README.md`."""

    caption_dropout = CaptionDropout.ZEROS
    TRANSFORMER_BLOCKS = ("transformer_blocks", "single_transformer_blocks")
    # The diffusers class name of the variant's transformer (`_class_name` in its config.json).
    transformer_class: ClassVar[str]
    # Which conditioning tensors belong to which text encoder, for caption dropout per encoder.
    encoder_outputs: ClassVar[dict[str, tuple[str, ...]]]
    # The text encoders' module prefixes in OneTrainer's own (legacy) LoRA files, read besides the kohya ones.
    legacy_prefixes: ClassVar[dict[str, str]]

    # -- loading --------------------------------------------------------------------------------------------------

    def load(self, config: TrainConfig) -> LoadedModel:
        from diffusers import FlowMatchEulerDiscreteScheduler

        from onetrainer.noise.flow_matching import FlowMatchingSchedule

        what = "the text encoders, the VAE and the tokenizers"
        where, options = part_wise_base(config, self.info.label, what, self.info.hub_file_sets)
        parts = KeptParts(config)
        parts["transformer"] = self._load_transformer(config, where, options)
        tokenizers = self.load_text_encoders(config, where, options, parts)
        parts["vae"] = load_vae(config, where, options)
        scheduler_config = load_diffusers_component(
            FlowMatchEulerDiscreteScheduler, where, "scheduler", options, config_only=True
        )
        slots = self.text_encoder_slots(config, parts, tokenizers)
        schedule = FlowMatchingSchedule(scheduler_config, patch_size=PATCH)
        state = FluxState(
            train_steps=int(scheduler_config.get("num_train_timesteps", DEFAULT_TRAIN_STEPS)),
            guidance=float(config.transformer.guidance_scale),
            mask_padding=bool(config.transformer.attention_mask),
        )
        return LoadedModel(config.model_type, parts, slots, schedule, config.base_model_name, state)

    def _load_transformer(self, config: TrainConfig, where: str, options: dict) -> torch.nn.Module:
        """The base's transformer, or the transformer part's own model (`transformer.model_name`): a diffusers folder,
        or an original single file (Black Forest Labs' layout, ComfyUI's prefix allowed) read on the base's
        transformer config."""
        from onetrainer.util.threads import library_attribute

        cls = library_attribute("diffusers", self.transformer_class)
        base_config = load_diffusers_component(cls, where, "transformer", options, config_only=True)
        found = base_config.get("_class_name")
        if found and found != self.transformer_class:
            raise ModelLoadError(
                f"{where} holds a {found}, not the {self.transformer_class} of {self.info.label}: choose the model "
                "type that fits it"
            )
        override = config.transformer.model_name.strip()
        if not override:
            dtype = load_dtype(config, "transformer")
            transformer = load_diffusers_component(cls, where, "transformer", options, dtype=dtype)
        else:
            transformer = self._transformer_override(cls, override, base_config, config)
            where = override
        self.check_transformer(transformer, config, where)
        return transformer

    def _transformer_override(
        self, cls: type, override: str, base_config: dict, config: TrainConfig
    ) -> torch.nn.Module:
        from onetrainer.precision import gguf_weights

        dtype = load_dtype(config, "transformer")
        path = resolve_local(override)
        if path.is_dir():
            subfolder = "transformer" if (path / "transformer" / "config.json").is_file() else None
            return read_pretrained(cls, str(path), dtype, subfolder=subfolder, local_files_only=True)
        if not path.is_file():
            raise ModelLoadError(f"the transformer's model (transformer.model_name) was not found: {override}")
        gguf = is_gguf_file(path)
        try:
            read, read_in = (None, None) if gguf else file_reading(path, dtype)
            if gguf:  # pre-quantized blocks, kept as they are (`precision/gguf_weights.py`)
                state, transformer_config = flux_keys.convert_original(gguf_weights.read_gguf(path), base_config, path)
            else:
                state, transformer_config = flux_keys.read_original_checkpoint(path, base_config, read)
        except ValueError as e:
            raise ModelLoadError(f"cannot read the transformer (transformer.model_name): {e}") from e
        transformer = empty_module(lambda: cls.from_config(transformer_config))  # the file's tensors become the weights
        if gguf:
            if config.transformer.weight_dtype not in GGUF_WEIGHT_DTYPES:
                raise ModelLoadError(NEEDS_GGUF_DTYPE.format(path=path))
            gguf_weights.prepare_gguf_layers(transformer, state, config.transformer.weight_dtype)
        return assign_weights(transformer, state, dtype, f"the transformer {path}", read_in)

    def check_transformer(self, transformer: torch.nn.Module, config: TrainConfig, where: str) -> None:
        """Refuse a transformer that does not fit the model type (Flux: an inpainting one, or the reverse)."""

    @abstractmethod
    def load_text_encoders(self, config: TrainConfig, where: str, options: dict, parts: KeptParts) -> dict[str, object]:
        """Adds the text encoders to `parts`, each read in its `load_dtype`, in declared order; returns their
        tokenizers by part."""

    @abstractmethod
    def text_encoder_slots(self, config: TrainConfig, parts: Mapping, tokenizers: dict) -> list[TextEncoderSlot]:
        """The text encoders as the methods see them, in the order of `info.parts`."""

    def t5_slot(self, config: TrainConfig, part: str, parts: Mapping, tokenizers: dict, prefix: str) -> TextEncoderSlot:
        """A T5's slot (its token embedding is `encoder.embed_tokens`), for `text_encoder_slots`."""
        t5 = parts[part]
        return TextEncoderSlot(
            part, t5, tokenizers[part], prefix, "t5", config.part(part).layer_skip,
            token_embedding=t5.encoder.embed_tokens,
        )  # fmt: skip

    # -- text and images ------------------------------------------------------------------------------------------

    def drop_captions(
        self,
        model: LoadedModel,
        captions: list[str],
        drops: Sequence[torch.Tensor | None],
        encode: Callable[[list[str]], Conditioning],
    ) -> Conditioning:
        """Each text encoder's share of the conditioning zeroed on its own draw (`encoder_outputs`); the attention
        masks stay, so a dropped caption is attended as zeros (OneTrainer's dropout for these models)."""
        tensors = dict(encode(captions).tensors)
        for slot, drop in zip(model.text_encoders, drops, strict=True):
            if drop is None:
                continue
            for name in self.encoder_outputs[slot.part]:
                value = tensors[name]
                keep = (~drop).to(value.device).view(-1, *([1] * (value.dim() - 1)))
                tensors[name] = value * keep.to(value.dtype)
        return Conditioning(tensors)

    def encode_images(self, model: LoadedModel, pixels: torch.Tensor) -> torch.Tensor:
        return encode_latents(model.part("vae"), pixels)

    # -- a training step ------------------------------------------------------------------------------------------

    def predict(self, model, noisy_latents, timesteps, conditioning, extra) -> Prediction:
        transformer = model.part("transformer")
        dtype = first_weight(transformer).dtype
        device = noisy_latents.device
        latents = self.latent_input(model, noisy_latents, extra)
        height, width = latents.shape[-2:]
        tokens = (height // PATCH) * (width // PATCH)
        inputs = self.transformer_inputs(model, conditioning, extra, len(latents), tokens)
        text = inputs.pop("encoder_hidden_states")
        output = transformer(
            hidden_states=pack(latents).to(dtype),
            encoder_hidden_states=text.to(dtype),
            # the schedule's model time is σ·T; the transformer takes σ (and multiplies by 1000 itself)
            timestep=(timesteps.float() / model.family_state(FluxState).train_steps).to(dtype),
            img_ids=image_ids(height // PATCH, width // PATCH, device),
            txt_ids=torch.zeros(text.shape[1], 3, device=device),
            return_dict=False,
            **{k: (v.to(dtype) if v.is_floating_point() else v) for k, v in inputs.items()},
        )[0]
        return Prediction(unpack(output, noisy_latents.shape[-2], noisy_latents.shape[-1]))

    def latent_input(self, model: LoadedModel, noisy_latents: torch.Tensor, extra: dict) -> torch.Tensor:
        """What is packed into the transformer's image tokens (Fill adds its masked latents and mask)."""
        return noisy_latents

    @abstractmethod
    def transformer_inputs(
        self, model: LoadedModel, conditioning: Conditioning, extra: dict, count: int, image_tokens: int
    ) -> dict[str, torch.Tensor]:
        """The transformer's text inputs (`encoder_hidden_states` and the variant's own) for `count` samples."""

    # -- sampling -------------------------------------------------------------------------------------------------

    def sample(self, model: LoadedModel, sample, apply_embeddings, zero_terminal_snr: bool):
        from onetrainer.sampling.sampler import render_pipeline

        # σ = 1 is pure noise already: nothing to rescale.
        return render_pipeline(self, model, sample, apply_embeddings, False)

    # -- saving ---------------------------------------------------------------------------------------------------

    def save_original_transformer(
        self, model: LoadedModel, destination: Path, dtype: torch.dtype, extra_metadata: dict | None = None
    ) -> None:
        """The transformer alone in Black Forest Labs' layout (fused q/k/v and linear1), as ComfyUI, Forge and
        `transformer.model_name` read it."""
        transformer = model.part("transformer")
        state = flux_keys.diffusers_to_original(plain_state(transformer), transformer_config(model))
        metadata = model_file_metadata(self, model, destination, extra_metadata)
        write_single_file(state, destination, dtype, metadata)

    writers: ClassVar[Mapping[ModelFormat, Writer]] = {
        ModelFormat.DIFFUSERS: FlowPipelineFolder.save_diffusers,
        ModelFormat.ORIGINAL_TRANSFORMER: save_original_transformer,
        ModelFormat.LEGACY_SAFETENSORS: save_original_transformer,
    }

    # -- LoRA files and names -------------------------------------------------------------------------------------

    def lora_file_state(self, model, part, kind, state, alphas, ranks, fmt=ModelFormat.KOHYA_LORA):
        """The transformer's adapters over the original names (`flux_lora.transformer_to_kohya`: exact fused LoRAs on
        q/k/v and linear1); the text encoders take the generic layout."""
        if part != self.denoiser_part:
            return None
        return flux_lora.transformer_to_kohya(kind, state, alphas, ranks, transformer_config(model))

    def read_lora_file(self, model, part, kind, state):
        if part != self.denoiser_part:
            return None
        return flux_lora.LAYOUT.read_file(kind, state, transformer_config(model))

    def kohya_name(self, model: LoadedModel, part: str, module_path: str) -> str:
        return self.lora_file_name(model, part, module_path, ModelFormat.KOHYA_LORA)

    def lora_file_name(self, model: LoadedModel, part: str, module_path: str, fmt: ModelFormat) -> str:
        """The transformer: `lora_unet_<original path>` (a slice of a fused layer: `lora_transformer_<diffusers
        path>`); a text encoder: its slot's prefix (LEGACY_LORA: OneTrainer's) over its module path, CLIP's with the
        `text_model.` level its checkpoints have."""
        if part == self.denoiser_part:
            return flux_lora.transformer_kohya_name(module_path, transformer_config(model))
        slot = next(s for s in model.text_encoders if s.part == part)
        prefix = slot.kohya_prefix if fmt is ModelFormat.KOHYA_LORA else self.legacy_prefixes[part]
        return kohya_lora.kohya_module_name(prefix, file_module_path(slot.encoder, module_path))


class FluxFamily(FluxTransformerFamily):
    """Flux.1 dev and schnell (FLUX_DEV_1) and Fill (FLUX_FILL_DEV_1): CLIP-L pooled + T5-XXL, a guidance input
    where the transformer has one, Fill's masked image and mask."""

    info = FLUX
    sampling_parts = frozenset(FLUX.parts)
    transformer_class = "FluxTransformer2DModel"
    encoder_outputs: ClassVar[dict[str, tuple[str, ...]]] = {
        "text_encoder": ("pooled",),
        "text_encoder_2": ("hidden_states",),
    }
    layer_blocks: ClassVar[dict[str, tuple[str, ...]]] = {
        "transformer": FluxTransformerFamily.TRANSFORMER_BLOCKS,
        "text_encoder_2": ("encoder.block",),
    }
    legacy_prefixes: ClassVar[dict[str, str]] = {
        "text_encoder": flux_lora.CLIP_PREFIX,
        "text_encoder_2": flux_lora.T5_READ_PREFIXES[-1],
    }

    def check_transformer(self, transformer, config, where) -> None:
        channels = transformer.config
        fill = channels.in_channels > (channels.out_channels or channels.in_channels)
        check_inpainting(fill, config.model_type, where, "Flux model (Fill)")

    def load_text_encoders(self, config, where, options, parts) -> dict[str, object]:
        from transformers import AutoTokenizer, CLIPTextModel, T5EncoderModel

        for part, cls in (("text_encoder", CLIPTextModel), ("text_encoder_2", T5EncoderModel)):
            parts[part] = load_diffusers_component(cls, where, part, options, dtype=load_dtype(config, part))
        return {
            "text_encoder": load_tokenizer(where, options),
            "text_encoder_2": load_tokenizer(where, options, subfolder="tokenizer_2", cls=AutoTokenizer),
        }

    def text_encoder_slots(self, config, parts, tokenizers) -> list[TextEncoderSlot]:
        clip = TextEncoderSlot(
            "text_encoder", parts["text_encoder"], tokenizers["text_encoder"], flux_lora.CLIP_PREFIX, "clip_l",
            config.text_encoder.layer_skip,
        )  # fmt: skip
        t5 = self.t5_slot(config, "text_encoder_2", parts, tokenizers, flux_lora.T5_PREFIX)
        t5.max_tokens = config.text_encoder_2_sequence_length
        return [clip, t5]

    # -- text -----------------------------------------------------------------------------------------------------

    def encode_text(self, model: LoadedModel, captions: list[str]) -> Conditioning:
        clip, t5 = model.text_encoders
        tokens = clip.tokenizer(
            captions, padding="max_length", max_length=CLIP_TOKENS, truncation=True, return_tensors="pt"
        )
        # Only the pooled output conditions Flux: it comes from the last layer whatever the clip skip (as OneTrainer).
        pooled = clip.encoder(tokens.input_ids.to(first_weight(clip.encoder).device)).pooler_output
        hidden, mask = t5_hidden_states(t5, captions, t5_tokens(model), use_mask=False)
        return Conditioning({"hidden_states": hidden, "pooled": pooled, "attention_mask": mask})

    # -- a training step ------------------------------------------------------------------------------------------

    def cache_extras(
        self, model: LoadedModel, pixels: torch.Tensor, masks: torch.Tensor | None, depths: list | None = None
    ) -> dict:
        if not model.type_info.inpainting or masks is None:
            return {}
        return inpainting_cache(self, model, pixels, masks)

    def batch_extras(self, model: LoadedModel, inputs: BatchInputs) -> dict[str, torch.Tensor]:
        latents = inputs.latents
        extra: dict[str, torch.Tensor] = {}
        if has_guidance(model):
            guidance = model.family_state(FluxState).guidance
            extra["guidance"] = torch.full((len(latents),), guidance, device=latents.device)
        if model.type_info.inpainting:
            extra.update(self._fill_inputs(model, inputs))
        return extra

    def _fill_inputs(self, model: LoadedModel, inputs: BatchInputs) -> dict[str, torch.Tensor]:
        """Fill's extra inputs: the latents of the image with the area to repaint blanked, and the mask as 64 channels
        at latent size (each latent pixel's 8x8 image pixels)."""
        latents = inputs.latents
        if inputs.input_masks is None:  # no masks to read (a model estimate): paint everything, from a blank image
            count, _, height, width = latents.shape
            masks = torch.ones(count, 1, height * VAE_FACTOR, width * VAE_FACTOR, device=latents.device)
            masked = torch.zeros_like(latents)
        else:
            masks = inputs.input_masks
            masked = inpainting_inputs(self, model, inputs)["masked_latents"]
        return {"masked_latents": masked, "mask": F.pixel_unshuffle(masks.to(masked.dtype), VAE_FACTOR)}

    def latent_input(self, model, noisy_latents, extra) -> torch.Tensor:
        if not model.type_info.inpainting:
            return noisy_latents
        like = noisy_latents
        return torch.cat([like, extra["masked_latents"].to(like), extra["mask"].to(like)], dim=1)

    def transformer_inputs(self, model, conditioning, extra, count, image_tokens) -> dict[str, torch.Tensor]:
        inputs = {
            "encoder_hidden_states": padding_masked(model, conditioning),
            "pooled_projections": conditioning.pooled,
        }
        if has_guidance(model):
            guidance = extra.get("guidance")
            if guidance is None:
                device = conditioning.hidden_states.device
                guidance = torch.full((count,), model.family_state(FluxState).guidance, device=device)
            inputs["guidance"] = guidance
        return inputs

    # -- sampling -------------------------------------------------------------------------------------------------

    def pipeline(self, model: LoadedModel, sampler):
        from diffusers import FluxFillPipeline, FluxPipeline

        clip, t5 = model.text_encoders
        cls = FluxFillPipeline if model.type_info.inpainting else FluxPipeline
        return cls(
            scheduler=sampler,
            vae=model.part("vae"),
            text_encoder=clip.encoder,
            tokenizer=clip.tokenizer,
            text_encoder_2=t5.encoder,
            tokenizer_2=t5.tokenizer,
            transformer=model.part("transformer"),
        )

    def prompt_arguments(self, model: LoadedModel, prompt: str, negative_prompt: str | None) -> dict:
        """Our own embeddings of the prompt; no negative prompt (the sample's CFG scale is the distilled guidance)."""
        positive = self.encode_text(model, [prompt])
        return {
            "prompt": None,
            "prompt_embeds": padding_masked(model, positive),
            "pooled_prompt_embeds": positive.pooled,
            "max_sequence_length": t5_tokens(model),
        }

    def pipeline_arguments(self, model: LoadedModel, sample, zero_terminal_snr: bool) -> dict:
        return inpainting_sample_inputs(sample) if model.type_info.inpainting else {}

    # -- names ----------------------------------------------------------------------------------------------------

    def metadata_kind(self, model: LoadedModel) -> ModelKind:
        if model.type_info.inpainting:
            return FILL_KIND
        return DEV_KIND if has_guidance(model) else SCHNELL_KIND

    def sample_defaults(self, model: LoadedModel) -> SampleDefaults:
        defaults = model.type_info.sample
        if has_guidance(model):
            return defaults
        # schnell is timestep-distilled to a few steps and has no guidance input (its model card: 4 steps, 0.0)
        return dataclasses.replace(defaults, diffusion_steps=SCHNELL_SAMPLE_STEPS, cfg_scale=0.0)


REFERENCE_AREA = 1024 * 1024  # a reference's most pixels (FluxKontextPipeline's `max_area`)
REFERENCE_STEP = VAE_FACTOR * PATCH  # a reference's sides in steps of 16 px, as the pipeline rounds them
_ONE_REFERENCE = (
    "Flux.1 Kontext takes one reference image per training image, not {count}: keep `<name>-reference.<ext>` beside "
    "each image and remove its numbered `<name>-reference-N.<ext>` files"
)
_MIXED_KONTEXT_REFERENCES = (
    "the images of one batch have references of different sizes: train Flux.1 Kontext with batch size 1 (gradient "
    "accumulation for larger batches) or give every reference of a bucket one size"
)


class FluxKontextFamily(FluxFamily):
    """Flux.1 Kontext [dev] (FLUX_KONTEXT_DEV_1): Flux.1 dev's parts, conditioning and guidance input, learning to
    change one reference image (`<name>-reference.<ext>`; an image with more is named and skipped by the scan, one
    without trains text to image) into the training image.

    As `FluxKontextPipeline` feeds it: the reference's latents are the VAE's mode, shifted and scaled as the image's
    ((z − shift)·scale), packed 2x2 as the image's and appended to the noisy image's tokens; their position ids are the
    image's kind, (1, row, column) over the reference's own grid, joined after the image's; the prediction (and so the
    loss) covers the noisy image's tokens only. Without a reference it is plain Flux.1 dev (text to image).

    The reference's size: the pipeline resizes a reference to one of Kontext's preferred resolutions (about 1024² px)
    unless called with `_auto_resize=False`. Training takes each reference at its own size instead (the image's crop
    applied), scaled down to at most `REFERENCE_AREA` pixels and its sides rounded down to 16 px as the pipeline
    rounds them. The reference is not scaled with its image to the bucket: references saved at the training
    resolution (the bucket's size, as Kontext pairs usually are) train at that size, not stretched to about 1024² px
    beside a 512 px image; larger ones cost tokens up to 1024² px. Samples get the reference sized by the same rule
    and pass `_auto_resize=False` (and the sample's area as `max_area`, else the pipeline renders about 1024² px), so
    they see what training saw. The references' latents are cached with their image."""

    info = FLUX_KONTEXT
    sampling_parts = frozenset(FLUX_KONTEXT.parts)

    def encode_references(self, model: LoadedModel, references: list) -> dict[str, torch.Tensor]:
        """A sample's one reference as the transformer reads it, cached with its latents: its latents [C, h, w]
        (packed in `predict`)."""
        if len(references) != 1:
            raise ValueError(_ONE_REFERENCE.format(count=len(references)))
        pixels = reference_pixels(references[0]).to(first_weight(model.part("vae")).device)
        return {"reference_latents": encode_latents(model.part("vae"), pixels)[0]}

    def typical_references(self, model: LoadedModel) -> dict[str, torch.Tensor]:
        """One square reference of `REFERENCE_AREA` pixels: 4,096 tokens joining the image's."""
        side = math.isqrt(REFERENCE_AREA) // VAE_FACTOR
        channels = model.part("vae").config.latent_channels
        return {"reference_latents": torch.zeros(1, channels, side, side)}

    def batch_extras(self, model: LoadedModel, inputs: BatchInputs) -> dict[str, torch.Tensor]:
        """Flux.1 dev's (the guidance) and each sample's reference latents: from the latent cache, else encoded
        now; none where the batch has no references (plain text to image)."""
        extra = super().batch_extras(model, inputs)
        if "reference_latents" in inputs.cached:
            references = inputs.cached["reference_latents"]
        elif inputs.references and any(inputs.references):
            encoded = [self.encode_references(model, pictures)["reference_latents"] for pictures in inputs.references]
            if any(e.shape != encoded[0].shape for e in encoded):
                raise ValueError(_MIXED_KONTEXT_REFERENCES)
            references = torch.stack(encoded)
        else:
            return extra
        extra["reference_latents"] = references
        return extra

    def predict(self, model, noisy_latents, timesteps, conditioning, extra) -> Prediction:
        references = extra.get("reference_latents")
        if references is None:
            return super().predict(model, noisy_latents, timesteps, conditioning, extra)
        transformer = model.part("transformer")
        dtype = first_weight(transformer).dtype
        device = noisy_latents.device
        height, width = noisy_latents.shape[-2:]
        image = pack(noisy_latents)
        joined = torch.cat([image, pack(references.to(image))], dim=1)
        inputs = self.transformer_inputs(model, conditioning, extra, len(noisy_latents), joined.shape[1])
        text = inputs.pop("encoder_hidden_states")
        output = transformer(
            hidden_states=joined.to(dtype),
            encoder_hidden_states=text.to(dtype),
            timestep=(timesteps.float() / model.family_state(FluxState).train_steps).to(dtype),
            img_ids=torch.cat(
                [image_ids(height // PATCH, width // PATCH, device), reference_ids(references).to(device)]
            ),
            txt_ids=torch.zeros(text.shape[1], 3, device=device),
            return_dict=False,
            **{k: (v.to(dtype) if v.is_floating_point() else v) for k, v in inputs.items()},
        )[0]
        return Prediction(unpack(output[:, : image.shape[1]], height, width))

    # -- sampling -------------------------------------------------------------------------------------------------

    def pipeline(self, model: LoadedModel, sampler):
        from diffusers import FluxKontextPipeline

        clip, t5 = model.text_encoders
        return FluxKontextPipeline(
            scheduler=sampler,
            vae=model.part("vae"),
            text_encoder=clip.encoder,
            tokenizer=clip.tokenizer,
            text_encoder_2=t5.encoder,
            tokenizer_2=t5.tokenizer,
            transformer=model.part("transformer"),
        )

    def pipeline_arguments(self, model: LoadedModel, sample, zero_terminal_snr: bool) -> dict:
        """The sample's size as the pipeline's `max_area` (else it renders about 1024² px at the sample's aspect) and
        its one reference image (`reference_images`), sized as training sizes it, the pipeline's own resizing off;
        without one, a plain Flux.1 dev sample."""
        from onetrainer.util.images import open_rgb

        arguments: dict = {"max_area": sample.width * sample.height}
        paths = [path for path in sample.reference_images if str(path).strip()]
        if len(paths) > 1:
            raise ValueError(
                f"Flux.1 Kontext takes one reference image per sample, not {len(paths)}: keep one in the sample's "
                "reference_images"
            )
        if paths:
            arguments.update(image=reference_image(open_rgb(Path(paths[0]))), _auto_resize=False)
        return arguments

    def metadata_kind(self, model: LoadedModel) -> ModelKind:
        return KONTEXT_KIND


class ChromaFamily(FluxTransformerFamily):
    """Chroma (CHROMA_1): T5-XXL alone, its mask also on the transformer's attention; real CFG in samples."""

    info = CHROMA
    sampling_parts = frozenset(CHROMA.parts)
    transformer_class = "ChromaTransformer2DModel"
    encoder_outputs: ClassVar[dict[str, tuple[str, ...]]] = {"text_encoder": ("hidden_states",)}
    layer_blocks: ClassVar[dict[str, tuple[str, ...]]] = {
        "transformer": FluxTransformerFamily.TRANSFORMER_BLOCKS,
        "text_encoder": ("encoder.block",),
    }
    legacy_prefixes: ClassVar[dict[str, str]] = {"text_encoder": flux_lora.CHROMA_T5_READ_PREFIXES[-1]}

    def load_text_encoders(self, config, where, options, parts) -> dict[str, object]:
        from transformers import AutoTokenizer, T5EncoderModel

        dtype = load_dtype(config, "text_encoder")
        parts["text_encoder"] = load_diffusers_component(T5EncoderModel, where, "text_encoder", options, dtype=dtype)
        return {"text_encoder": load_tokenizer(where, options, cls=AutoTokenizer)}

    def text_encoder_slots(self, config, parts, tokenizers) -> list[TextEncoderSlot]:
        return [self.t5_slot(config, "text_encoder", parts, tokenizers, flux_lora.CHROMA_T5_PREFIX)]

    def encode_text(self, model: LoadedModel, captions: list[str]) -> Conditioning:
        hidden, mask = t5_hidden_states(model.text_encoders[0], captions, T5_TOKENS, use_mask=True)
        # The transformer attends to the caption's tokens and the first padding token (ChromaPipeline's mask).
        positions = torch.arange(mask.shape[1], device=mask.device)
        attended = (positions[None, :] <= mask.sum(dim=1, keepdim=True)).to(mask.dtype)
        return Conditioning({"hidden_states": hidden, "attention_mask": attended})

    def transformer_inputs(self, model, conditioning, extra, count, image_tokens) -> dict[str, torch.Tensor]:
        hidden = conditioning.hidden_states
        mask = conditioning.get("attention_mask")
        if mask is None:
            return {"encoder_hidden_states": hidden}
        # The padding no caption of the batch attends to is left out (the result is the same, in less time).
        mask = mask.bool()
        try:
            used = max(1, int(mask.sum(dim=1).max()))
            length = min(hidden.shape[1], -(-used // CHROMA_MASK_STEP) * CHROMA_MASK_STEP)
            hidden, mask = hidden[:, :length], mask[:, :length]
            if bool(mask.all()):
                return {"encoder_hidden_states": hidden}
        except RuntimeError:  # tensors without values (the memory estimate's): all the tokens, masked
            pass
        image = torch.ones(len(mask), image_tokens, dtype=torch.bool, device=mask.device)
        return {"encoder_hidden_states": hidden, "attention_mask": torch.cat([mask, image], dim=1)}

    # -- sampling -------------------------------------------------------------------------------------------------

    def pipeline(self, model: LoadedModel, sampler):
        from diffusers import ChromaPipeline

        slot = model.text_encoders[0]
        return ChromaPipeline(
            scheduler=sampler,
            vae=model.part("vae"),
            text_encoder=slot.encoder,
            tokenizer=slot.tokenizer,
            transformer=model.part("transformer"),
        )

    def prompt_arguments(self, model: LoadedModel, prompt: str, negative_prompt: str | None) -> dict:
        """Our own embeddings and masks of the prompt and the negative prompt. The masks go in as booleans: the
        pipeline's own float mask would be added to the attention scores instead of masking them."""
        positive = self.encode_text(model, [prompt])
        negative = self.encode_text(model, [negative_prompt or ""])
        return {
            "prompt": None,
            "negative_prompt": None,
            "prompt_embeds": positive.hidden_states,
            "prompt_attention_mask": positive.get("attention_mask").bool(),
            "negative_prompt_embeds": negative.hidden_states,
            "negative_prompt_attention_mask": negative.get("attention_mask").bool(),
            "max_sequence_length": T5_TOKENS,
        }

    def metadata_kind(self, model: LoadedModel) -> ModelKind:
        return CHROMA_KIND


# -- shared pieces ----------------------------------------------------------------------------------------------------


def transformer_config(model: LoadedModel) -> dict:
    """The transformer's config as the key maps read it."""
    return dict(model.part("transformer").config)


def padding_masked(model: LoadedModel, conditioning: Conditioning) -> torch.Tensor:
    """Flux's T5 hidden states, the padding's set to zero where `transformer.attention_mask` asks (OneTrainer's "Force
    attention mask"; the transformer attends to every token either way)."""
    hidden = conditioning.hidden_states
    mask = conditioning.get("attention_mask")
    if not model.family_state(FluxState).mask_padding or mask is None:
        return hidden
    return hidden * mask[..., None].to(hidden.dtype)


def has_guidance(model: LoadedModel) -> bool:
    """Whether the transformer takes a guidance value (Flux dev and Fill; not schnell, not Chroma)."""
    return bool(getattr(model.part("transformer").config, "guidance_embeds", False))


def t5_tokens(model: LoadedModel) -> int:
    """How many T5 tokens Flux is prompted with: the config's `text_encoder_2_sequence_length`, else the model's own
    512, schnell (no guidance input) 256."""
    configured = model.text_encoders[-1].max_tokens
    if configured:
        return configured
    return T5_TOKENS if has_guidance(model) else SCHNELL_T5_TOKENS


def image_ids(rows: int, columns: int, device) -> torch.Tensor:
    """[rows·columns, 3] position ids of the image tokens: (0, row, column), row-major as `pack` orders them."""
    ids = torch.zeros(rows, columns, 3, device=device)
    ids[..., 1] += torch.arange(rows, device=device)[:, None]
    ids[..., 2] += torch.arange(columns, device=device)[None, :]
    return ids.reshape(rows * columns, 3)


def reference_ids(references: torch.Tensor, device=None) -> torch.Tensor:
    """The position ids of a Kontext reference's tokens: (1, row, column) over its own grid of 2x2 patches (on
    `device`, else the references')."""
    ids = image_ids(references.shape[-2] // PATCH, references.shape[-1] // PATCH, device or references.device)
    ids[:, 0] = 1
    return ids


def reference_size(width: int, height: int) -> tuple[int, int]:
    """(width, height) a Kontext reference is used at: scaled down to at most `REFERENCE_AREA` pixels, aspect kept,
    the sides rounded down to multiples of 16 px (as FluxKontextPipeline rounds them)."""
    if width * height > REFERENCE_AREA:
        scale = math.sqrt(REFERENCE_AREA / (width * height))
        width, height = round(width * scale), round(height * scale)
    return max(width // REFERENCE_STEP, 1) * REFERENCE_STEP, max(height // REFERENCE_STEP, 1) * REFERENCE_STEP


def reference_image(image):
    """A sample's reference (a PIL image) at `reference_size`, resized as the pipeline resizes an image."""
    from diffusers.image_processor import VaeImageProcessor

    width, height = reference_size(image.width, image.height)
    if (width, height) == image.size:
        return image
    return VaeImageProcessor(vae_scale_factor=REFERENCE_STEP).resize(image, height, width)


def reference_pixels(picture: torch.Tensor) -> torch.Tensor:
    """A training reference ([3, h, w] in [-1, 1]) at `reference_size`, [1, 3, H, W]: as it is where it already has
    that size, else resized as `reference_image` resizes a sample's (through a picture, as the pipeline does)."""
    from diffusers.image_processor import VaeImageProcessor

    from onetrainer.sampling.sampler import to_image

    height, width = picture.shape[-2:]
    size = reference_size(width, height)
    if size == (width, height):
        return picture[None]
    image = to_image(((picture.detach().float().cpu() + 1) / 2).permute(1, 2, 0).numpy())
    resized = reference_image(image)
    return VaeImageProcessor(vae_scale_factor=REFERENCE_STEP).preprocess(resized, size[1], size[0]).to(picture)
