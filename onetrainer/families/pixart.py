"""PixArt-Alpha (512 and 1024 models) and PixArt-Sigma: a DiT (`PixArtTransformer2DModel`) conditioned on T5 with an
attention mask, the SD VAE (Sigma: the SDXL VAE), linear betas, epsilon prediction with learned variance.

- The transformer predicts 8 channels: the noise (the configured losses apply to it) and 4 variance values, trained
  by the schedule's variational bound (`noise/variational_bound.py`) at `vb_loss_strength`, the noise half detached.
- Text: 120 T5 tokens (Sigma: 300), padded, the mask passed to T5 and to the transformer; clip skip takes an earlier
  hidden state through T5's final layer norm. T5 never runs under fp16 autocast (it overflows). Caption dropout
  zeroes the hidden states and the mask, as OneTrainer does.
- The 1024 models (`sample_size == 128`) take the bucket's resolution (h, w in pixels) and aspect ratio (h / w).
- The original checkpoint layout (`PixArt-XL-2-*.pth`, fused q/k/v) holds the transformer alone: it is read as the
  transformer part's model (`transformer.model_name`) over a diffusers base (`weights/pixart_keys.py`), and written
  as ORIGINAL_TRANSFORMER / LEGACY_SAFETENSORS.
- Sampling goes through diffusers' PixArt pipeline with our own prompt embeddings (so no caption cleaning, which
  would strip `<placeholder>` tokens) and without resolution binning.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import torch

from onetrainer.config.enums import ModelFormat, ModelType
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
from onetrainer.families.loading import (
    KeptParts,
    ModelLoadError,
    assign_weights,
    empty_module,
    load_diffusers_component,
    load_dtype,
    load_tokenizer,
    part_wise_base,
    read_pretrained,
)
from onetrainer.families.pixart_info import PIXART
from onetrainer.families.saving import model_file_metadata, plain_state, save_pipeline_folder, write_single_file
from onetrainer.families.schedules import discrete_schedule
from onetrainer.families.sources import resolve_local
from onetrainer.families.vae import encode_latents, load_vae
from onetrainer.noise.prediction import Prediction
from onetrainer.noise.variational_bound import split_learned_variance
from onetrainer.weights import pixart_keys, pixart_lora
from onetrainer.weights.metadata import ModelKind

if TYPE_CHECKING:
    from onetrainer.config import TrainConfig

CAPTION_TOKENS = {ModelType.PIXART_ALPHA: 120, ModelType.PIXART_SIGMA: 300}
KIND = ModelKind("pixart-alpha", "pixart_alpha")
SIGMA_KIND = ModelKind("pixart-sigma", "pixart_sigma")
VAE_FACTOR = 8


@dataclass(slots=True)
class PixArtState(FamilyState):
    """What a PixArt model keeps besides its parts: its caption length in T5 tokens (Alpha 120, Sigma 300), and the
    "no caption" embedding of an original checkpoint it was read from (`y_embedder.y_embedding`, written back into
    the original file it saves; None: zeros)."""

    tokens: int = CAPTION_TOKENS[ModelType.PIXART_ALPHA]
    y_embedding: torch.Tensor | None = None


class PixArtFamily(Family):
    info = PIXART
    caption_dropout = CaptionDropout.ZEROS
    sampling_parts = frozenset(PIXART.parts)
    text_encoder_blocks: ClassVar[str] = r"(^|\.)block\.\d+\."
    layer_blocks: ClassVar[dict[str, tuple[str, ...]]] = {
        "transformer": ("transformer_blocks",),
        "text_encoder": ("encoder.block",),
    }
    # -- loading --------------------------------------------------------------------------------------------------

    def load(self, config: TrainConfig) -> LoadedModel:
        from diffusers import DDPMScheduler
        from transformers import AutoTokenizer, T5EncoderModel

        where, options = part_wise_base(config, "PixArt", "T5, the VAE and the tokenizer", self.info.hub_file_sets)
        parts = KeptParts(config)
        transformer, y_embedding = self._load_transformer(config, where, options)
        parts["transformer"] = transformer
        dtype = load_dtype(config, "text_encoder")
        parts["text_encoder"] = load_diffusers_component(T5EncoderModel, where, "text_encoder", options, dtype=dtype)
        parts["vae"] = load_vae(config, where, options)
        tokenizer = load_tokenizer(where, options, cls=AutoTokenizer)
        scheduler_config = load_diffusers_component(DDPMScheduler, where, "scheduler", options, config_only=True)
        t5 = parts["text_encoder"]
        slot = TextEncoderSlot(
            "text_encoder", t5, tokenizer, pixart_lora.TEXT_ENCODER_PREFIX, "t5", config.text_encoder.layer_skip,
            token_embedding=t5.encoder.embed_tokens,
        )  # fmt: skip
        state = PixArtState(y_embedding=y_embedding)
        if config.model_type in CAPTION_TOKENS:
            state.tokens = CAPTION_TOKENS[config.model_type]
        schedule = discrete_schedule(scheduler_config, False, config.rescale_noise_scheduler_to_zero_terminal_snr)
        return LoadedModel(config.model_type, parts, [slot], schedule, config.base_model_name, state)

    def _load_transformer(self, config: TrainConfig, where: str, options: dict):
        """The base's transformer, or the transformer part's own model: a diffusers folder, or an original PixArt
        checkpoint (.pth / .safetensors) read with the base transformer's config; and that checkpoint's "no caption"
        embedding (None where there is none)."""
        from diffusers import PixArtTransformer2DModel

        dtype = load_dtype(config, "transformer")
        override = config.transformer.model_name.strip()
        if not override:
            return load_diffusers_component(PixArtTransformer2DModel, where, "transformer", options, dtype=dtype), None
        path = resolve_local(override)
        if path.is_dir():
            subfolder = "transformer" if (path / "transformer" / "config.json").is_file() else None
            transformer = read_pretrained(
                PixArtTransformer2DModel, str(path), dtype, subfolder=subfolder, local_files_only=True
            )
            return transformer, None
        if not path.is_file():
            raise ModelLoadError(f"the transformer's model (transformer.model_name) was not found: {override}")
        transformer_config = load_diffusers_component(
            PixArtTransformer2DModel, where, "transformer", options, config_only=True
        )
        try:
            state, native_only = pixart_keys.read_native_checkpoint(path, transformer_config, dtype)
        except ValueError as e:
            raise ModelLoadError(f"cannot read the transformer (transformer.model_name): {e}") from e
        transformer = empty_module(lambda: PixArtTransformer2DModel.from_config(transformer_config))
        # built in float32 and the file's tensors copied in, before: the weights as that copy and the cast left them
        assign_weights(transformer, state, dtype, f"the PixArt transformer {path}", torch.float32)
        return transformer, native_only.get(pixart_keys.Y_EMBEDDING)

    # -- text and images ------------------------------------------------------------------------------------------

    def encode_text(self, model: LoadedModel, captions: list[str]) -> Conditioning:
        slot = model.text_encoders[0]
        tokens = slot.tokenizer(
            captions,
            padding="max_length",
            max_length=model.family_state(PixArtState).tokens,
            truncation=True,
            return_tensors="pt",
        )
        encoder = slot.encoder
        device = first_weight(encoder).device
        mask = tokens.attention_mask.to(device)
        # T5 overflows in float16: never under fp16 autocast; it runs in its own weight dtype (bf16 or fp32).
        with torch.autocast(device.type, enabled=False):
            output = encoder(tokens.input_ids.to(device), attention_mask=mask, output_hidden_states=slot.layer_skip > 0)
            if slot.layer_skip > 0:
                hidden = encoder.encoder.final_layer_norm(output.hidden_states[-(slot.layer_skip + 1)])
            else:
                hidden = output.last_hidden_state
        return Conditioning({"hidden_states": hidden, "attention_mask": mask})

    def encode_images(self, model: LoadedModel, pixels: torch.Tensor) -> torch.Tensor:
        return encode_latents(model.part("vae"), pixels)

    # -- a training step ------------------------------------------------------------------------------------------

    def batch_extras(self, model: LoadedModel, inputs: BatchInputs) -> dict[str, torch.Tensor]:
        extra: dict[str, torch.Tensor] = {}
        if _has_micro_conditions(model):
            height, width = (int(s) * VAE_FACTOR for s in inputs.latents.shape[-2:])
            extra.update(micro_conditions(height, width, len(inputs.latents), inputs.latents.device))
        return extra

    def predict(self, model, noisy_latents, timesteps, conditioning, extra) -> Prediction:
        transformer = model.part("transformer")
        dtype = first_weight(transformer).dtype
        added = {"resolution": None, "aspect_ratio": None}
        if _has_micro_conditions(model):
            if "resolution" not in extra:
                height, width = (int(s) * VAE_FACTOR for s in noisy_latents.shape[-2:])
                extra = {**extra, **micro_conditions(height, width, len(noisy_latents), noisy_latents.device)}
            added = {"resolution": extra["resolution"].to(dtype), "aspect_ratio": extra["aspect_ratio"].to(dtype)}
        mask = conditioning.get("attention_mask")
        output = transformer(
            noisy_latents.to(dtype),
            encoder_hidden_states=conditioning.hidden_states.to(dtype),
            timestep=timesteps,
            added_cond_kwargs=added,
            encoder_attention_mask=mask,
        ).sample
        if output.shape[1] != 2 * noisy_latents.shape[1]:
            return Prediction(output)
        # The trainer adds the schedule's variational bound on the variance half (at vb_loss_strength).
        noise, variance = split_learned_variance(output)
        return Prediction(noise, variance=variance)

    # -- sampling -------------------------------------------------------------------------------------------------

    def sample(self, model: LoadedModel, sample, apply_embeddings, zero_terminal_snr: bool):
        from onetrainer.sampling.sampler import render_pipeline

        # PixArt's pipeline takes no guidance rescale: the sampler follows the schedule as trained.
        return render_pipeline(self, model, sample, apply_embeddings, False)

    def prompt_arguments(self, model: LoadedModel, prompt: str, negative_prompt: str | None) -> dict:
        positive = self.encode_text(model, [prompt])
        negative = self.encode_text(model, [negative_prompt or ""])
        return {
            "prompt": None,
            "negative_prompt": None,  # the pipeline's default "" would clash with the embeddings
            "prompt_embeds": positive.hidden_states,
            "prompt_attention_mask": positive.get("attention_mask"),
            "negative_prompt_embeds": negative.hidden_states,
            "negative_prompt_attention_mask": negative.get("attention_mask"),
            "use_resolution_binning": False,
            "max_sequence_length": model.family_state(PixArtState).tokens,
        }

    def pipeline(self, model: LoadedModel, sampler):
        from diffusers import PixArtAlphaPipeline, PixArtSigmaPipeline

        cls = PixArtSigmaPipeline if model.model_type is ModelType.PIXART_SIGMA else PixArtAlphaPipeline
        return cls(
            tokenizer=model.text_encoders[0].tokenizer,
            text_encoder=model.part("text_encoder"),
            vae=model.part("vae"),
            transformer=model.part("transformer"),
            scheduler=sampler,
        )

    # -- saving ---------------------------------------------------------------------------------------------------

    def save_diffusers(
        self, model: LoadedModel, destination: Path, dtype: torch.dtype, metadata: dict | None = None
    ) -> None:
        """The diffusers pipeline folder (`metadata`, a single file's header entries, has no place in it)."""
        from diffusers import DPMSolverMultistepScheduler

        scheduler = DPMSolverMultistepScheduler.from_config(model.schedule.scheduler_config)
        save_pipeline_folder(self.pipeline(model, scheduler), destination, dtype)

    def save_original_transformer(
        self, model: LoadedModel, destination: Path, dtype: torch.dtype, extra_metadata: dict | None = None
    ) -> None:
        """The transformer alone in PixArt's own keys (q/k/v fused), as ComfyUI and PixArt's scripts load it."""
        transformer = model.part("transformer")
        kept = model.family_state(PixArtState)
        state = pixart_keys.diffusers_to_native(
            plain_state(transformer), transformer.config, kept.y_embedding, kept.tokens
        )
        resolution = model.type_info.resolution if _has_micro_conditions(model) else 512
        metadata = model_file_metadata(self, model, destination, extra_metadata, resolution)
        write_single_file(state, destination, dtype, metadata)

    writers: ClassVar[Mapping[ModelFormat, Writer]] = {
        ModelFormat.DIFFUSERS: save_diffusers,
        ModelFormat.ORIGINAL_TRANSFORMER: save_original_transformer,
        ModelFormat.LEGACY_SAFETENSORS: save_original_transformer,
    }

    def save_backup(self, model: LoadedModel, folder: Path) -> None:
        """A diffusers folder: the backup can also be used as a base model."""
        self.save_diffusers(model, folder, torch.float32)

    def backup_state(self, model: LoadedModel, folder: Path, part: str) -> dict[str, torch.Tensor]:
        state = super().backup_state(model, folder, part)
        # transformers writes T5's tied token table once (`shared.weight`); the module also names it in the encoder.
        if part == "text_encoder" and "shared.weight" in state:
            state.setdefault("encoder.embed_tokens.weight", state["shared.weight"])
        return state

    # -- LoRA files -----------------------------------------------------------------------------------------------

    def lora_file_state(self, model, part, kind, state, alphas, ranks, fmt=ModelFormat.KOHYA_LORA):
        """KOHYA_LORA over PixArt's native names (`pixart_lora.LAYOUT`): LoRAs on to_q/to_k/to_v (to_k/to_v) become
        one exact LoRA on the fused `attn.qkv` (`cross_attn.kv_linear`), the layout ComfyUI maps for PixArt. LyCORIS
        kinds have no exact fused form: they keep one entry per projection (our own reading only)."""
        if part != "transformer":
            return None
        return pixart_lora.LAYOUT.to_kohya(kind, state, alphas, ranks, _transformer_config(model))

    def read_lora_file(self, model, part, kind, state):
        if part != "transformer":
            return None
        return pixart_lora.LAYOUT.read_file(kind, state, _transformer_config(model))

    # -- names ----------------------------------------------------------------------------------------------------

    def kohya_name(self, model: LoadedModel, part: str, module_path: str) -> str:
        if part == "transformer":
            return pixart_lora.LAYOUT.kohya_name(module_path, _transformer_config(model))
        return pixart_lora.text_encoder_kohya_name(module_path)

    def metadata_kind(self, model: LoadedModel) -> ModelKind:
        return SIGMA_KIND if model.model_type is ModelType.PIXART_SIGMA else KIND


def _transformer_config(model: LoadedModel) -> dict:
    return dict(model.part("transformer").config)


def _has_micro_conditions(model: LoadedModel) -> bool:
    return pixart_keys.has_micro_conditions(model.part("transformer").config)


def micro_conditions(height: int, width: int, count: int, device) -> dict[str, torch.Tensor]:
    """The 1024 models' resolution (h, w in pixels) and aspect ratio (h / w) inputs for `count` samples."""
    resolution = torch.tensor([[float(height), float(width)]] * count, device=device)
    aspect = torch.tensor([[height / width]] * count, device=device)
    return {"resolution": resolution, "aspect_ratio": aspect}
