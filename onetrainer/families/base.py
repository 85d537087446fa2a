"""The small interface every model family implements; the training methods and the loop use only this.

A family is declarative facts (from `onetrainer.config.model_types`) plus a handful of calls: load, encode_text,
encode_images, predict (all extra conditioning lives here), pipeline (for sampling), save, and the key maps for
single-file and kohya-style files.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from onetrainer.config.enums import ModelFormat, ModelType
from onetrainer.config.model_types import FamilyInfo, ModelTypeInfo, model_type_info


@dataclass
class TextEncoderSlot:
    """One text encoder with its tokenizer, as the methods see it."""

    part: str  # "text_encoder", "text_encoder_2"
    encoder: torch.nn.Module
    tokenizer: Any
    kohya_prefix: str  # "lora_te", "lora_te1", …
    embedding_key: str  # the tensor name in embedding files: "emb_params", "clip_l", "clip_g"
    layer_skip: int = 0


@dataclass
class LoadedModel:
    """A loaded model: its parts by name, text encoders, noise scheduler and prediction type."""

    model_type: ModelType
    parts: dict[str, torch.nn.Module]
    text_encoders: list[TextEncoderSlot]
    noise_scheduler: Any  # a diffusers scheduler used for training (add_noise, get_velocity, alphas)
    v_prediction: bool
    source: str
    extra: dict[str, Any] = field(default_factory=dict)  # family-specific state (e.g. original keys to keep)

    @property
    def info(self) -> ModelTypeInfo:
        return model_type_info(self.model_type)

    def part(self, name: str) -> torch.nn.Module:
        return self.parts[name]

    @property
    def denoiser(self) -> torch.nn.Module:
        return self.parts[self.info.family.parts[0]]


@dataclass
class Conditioning:
    """What the denoiser is conditioned on for a batch of captions."""

    hidden_states: torch.Tensor
    pooled: torch.Tensor | None = None


class Family(ABC):
    """One model family. Subclasses set `info` and implement the calls below."""

    info: FamilyInfo

    @property
    def denoiser_part(self) -> str:
        return self.info.parts[0]

    @abstractmethod
    def load(self, source: str, model_type: ModelType, dtypes: dict[str, torch.dtype], offline: bool) -> LoadedModel:
        """Load from a diffusers folder, a single file, a hub id or one of our backup folders."""

    @abstractmethod
    def tokenize(self, model: LoadedModel, captions: list[str]) -> list[torch.Tensor]:
        """Token ids per text encoder, each [B, L]."""

    @abstractmethod
    def encode_text(self, model: LoadedModel, tokens: list[torch.Tensor]) -> Conditioning:
        """Run the text encoders (with their clip skip) on token ids."""

    @abstractmethod
    def encode_images(self, model: LoadedModel, pixels: torch.Tensor) -> torch.Tensor:
        """Pixels in [-1, 1] → scaled latents."""

    def batch_inputs(self, model: LoadedModel, batch, pixels: torch.Tensor, input_masks: torch.Tensor | None) -> dict:
        """Per-batch denoiser inputs beyond latents, timesteps and text (SDXL's size and crop ids, the inpainting mask
        and masked image). `batch` carries `original_sizes` and `crop_offsets` ((top, left) in the resized image);
        `input_masks` is the inpainting input mask (None for other models)."""
        return {}

    @abstractmethod
    def predict(
        self,
        model: LoadedModel,
        noisy_latents: torch.Tensor,
        timesteps: torch.Tensor,
        conditioning: Conditioning,
        extra: dict[str, torch.Tensor],
    ) -> torch.Tensor:
        """The denoiser's prediction; `extra` holds per-batch inputs such as the inpainting mask and image."""

    @abstractmethod
    def pipeline(self, model: LoadedModel, sampler: Any) -> Any:
        """A diffusers pipeline over the live modules, for sampling."""

    def prompt_arguments(self, model: LoadedModel, prompt: str, negative_prompt: str | None) -> dict:
        """The pipeline call's prompt arguments for a sample: the texts, or embeddings a family computes itself (e.g.
        with a clip skip per text encoder, which the pipeline cannot express)."""
        return {"prompt": prompt, "negative_prompt": negative_prompt}

    @abstractmethod
    def save(self, model: LoadedModel, fmt: ModelFormat, destination: Path, dtype: torch.dtype) -> None:
        """Write the whole model (fine-tune result) in `fmt` at `destination`."""

    @abstractmethod
    def kohya_name(self, part: str, module_path: str) -> str:
        """The kohya LoRA module name of a module of `part` (`lora_unet_…`, `lora_te_…`)."""

    @abstractmethod
    def metadata_kind(self, model: LoadedModel) -> str:
        """The model kind for file metadata: "sd1", "sd2", "sd2-v", "sdxl"."""


def first_weight(module: torch.nn.Module) -> torch.Tensor:
    """The module's first parameter, whose dtype and device are the module's own (a base weight: adapters come after
    it). diffusers' `.dtype` / `.device` walk every submodule, which costs milliseconds per call on a UNet."""
    # Weights stored as float8 (FLOAT_8 parts) compute in another dtype: the first weight that is not float8 tells it.
    return next((p for p in module.parameters() if p.dtype not in _FLOAT8), next(module.parameters()))


_FLOAT8 = (torch.float8_e4m3fn, torch.float8_e5m2)
