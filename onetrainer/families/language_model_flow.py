"""What the flow-matching transformer families conditioned on one language model share (Qwen-Image and its Edit
models, Z-Image): the single text encoder's slot and kohya names, the model's own flow-matching schedule, samples
through the family's diffusers pipeline, and the transformer alone as one file in diffusers' names. Each family class
derives from `LanguageModelFlowFamily` and declares its parts' loading, its text encoding and its prediction."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import torch

from onetrainer.families.base import (
    CaptionDropout,
    Conditioning,
    Family,
    FamilyState,
    LoadedModel,
    TextEncoderSlot,
    first_weight,
)
from onetrainer.families.latent_patches import PATCH
from onetrainer.families.loading import KeptParts, load_diffusers_component
from onetrainer.families.saving import FlowPipelineFolder, model_file_metadata, plain_state, write_single_file
from onetrainer.weights import kohya_lora

if TYPE_CHECKING:
    from onetrainer.config import TrainConfig

DEFAULT_TRAIN_STEPS = 1000
KOHYA_PREFIXES = {"transformer": "lora_unet", "text_encoder": "lora_te1"}


@dataclass(slots=True)
class LanguageModelFlowState(FamilyState):
    """What such a model keeps besides its parts: the schedule's T (`num_train_timesteps` of its scheduler config),
    which turns the model time σ·T back into σ. A family with more declares a subclass (`state_class`)."""

    train_steps: int = DEFAULT_TRAIN_STEPS


class LanguageModelFlowFamily(FlowPipelineFolder, Family):
    # The empty caption through the model's prompt template: what its pipeline's negative prompt is by default.
    caption_dropout = CaptionDropout.EMPTY_CAPTION
    # The text encoder's vectors' key in an embedding file (ComfyUI's name for the encoder).
    embedding_key: ClassVar[str]
    # The class of the family's state (`LoadedModel.family_state`): this one's, or a subclass with the family's own.
    state_class: ClassVar[type[LanguageModelFlowState]] = LanguageModelFlowState

    def loaded_model(self, config: TrainConfig, parts: KeptParts, tokenizer, where: str, options: dict) -> LoadedModel:
        """The model from its parts (each put in its form as it was read), the text encoder's slot, the schedule on
        the model's own scheduler config."""
        from diffusers import FlowMatchEulerDiscreteScheduler

        from onetrainer.noise.flow_matching import FlowMatchingSchedule

        scheduler_config = load_diffusers_component(
            FlowMatchEulerDiscreteScheduler, where, "scheduler", options, config_only=True
        )
        slot = TextEncoderSlot(
            "text_encoder",
            parts["text_encoder"],
            tokenizer,
            KOHYA_PREFIXES["text_encoder"],
            self.embedding_key,
            config.text_encoder.layer_skip,
        )
        schedule = FlowMatchingSchedule(scheduler_config, patch_size=PATCH)
        state = self.state_class(train_steps=int(scheduler_config.get("num_train_timesteps", DEFAULT_TRAIN_STEPS)))
        return LoadedModel(config.model_type, parts, [slot], schedule, config.base_model_name, state)

    def text_cache_row(self, conditioning: Conditioning, index: int) -> dict[str, torch.Tensor]:
        """The caption's tokens without the padding up to 512: `predict` cuts every caption to its attended tokens
        anyway, and 512 tokens of a 4–7B encoder's states are 5–7 MiB a caption in the cache and in each step's copy to
        the device, where a caption's own tokens are a few hundred KiB."""
        return conditioning.row_of_its_tokens(index)

    def chat_prompt_tokens(
        self, slot: TextEncoderSlot, captions: list[str], length: int, enable_thinking: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Each caption as one user message of the language model's chat template (with the generation prompt, as the
        pipelines prompt it), padded and cut to `length` tokens: the token ids and the attention mask, on the encoder's
        device. `enable_thinking` is the template's switch for the model's thinking block, which the pipelines set
        differently (Z-Image on, Flux.2 [klein] off)."""
        texts = [
            slot.tokenizer.apply_chat_template(
                [{"role": "user", "content": caption}], tokenize=False, add_generation_prompt=True,
                enable_thinking=enable_thinking,
            )
            for caption in captions
        ]  # fmt: skip
        tokens = slot.tokenizer(texts, padding="max_length", max_length=length, truncation=True, return_tensors="pt")
        device = first_weight(slot.encoder).device
        return tokens.input_ids.to(device), tokens.attention_mask.to(device)

    def sigma(self, model: LoadedModel, timesteps: torch.Tensor) -> torch.Tensor:
        """σ from the model time σ·T the schedule gives `predict`."""
        return timesteps.float() / model.family_state(LanguageModelFlowState).train_steps

    def sample(self, model: LoadedModel, sample, apply_embeddings, zero_terminal_snr: bool):
        from onetrainer.sampling.sampler import render_pipeline

        return render_pipeline(self, model, sample, apply_embeddings, False)  # σ = 1 is pure noise already

    def save_original_transformer(
        self, model: LoadedModel, destination: Path, dtype: torch.dtype, extra_metadata: dict | None = None
    ) -> None:
        """The transformer alone in one file, in diffusers' names (OneTrainer's ORIGINAL_TRANSFORMER), which
        diffusers' `from_single_file` and this trainer (`transformer.model_name`) read."""
        self.write_transformer(model, plain_state(model.part("transformer")), destination, dtype, extra_metadata)

    def write_transformer(self, model, state: dict, destination: Path, dtype: torch.dtype, extra_metadata) -> None:
        metadata = model_file_metadata(self, model, destination, extra_metadata)
        write_single_file(state, destination, dtype, metadata)

    def kohya_name(self, model: LoadedModel, part: str, module_path: str) -> str:
        return kohya_lora.kohya_module_name(KOHYA_PREFIXES[part], module_path)
