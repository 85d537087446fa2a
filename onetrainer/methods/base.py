"""What every training method provides to the loop: parameter groups, freezing, backups and the output file."""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.utils.checkpoint

from onetrainer.config.enums import TrainingMethod
from onetrainer.config.resolution import parse_resolution
from onetrainer.config.timing import stop_after_reached
from onetrainer.families.base import Family, LoadedModel
from onetrainer.methods.embedding import EmbeddingSet, bundled_embeddings, embedding_file_path
from onetrainer.precision.dtypes import torch_dtype
from onetrainer.weights.checkpoint_files import load_state_dict
from onetrainer.weights.embedding_file import save_embedding
from onetrainer.weights.metadata import model_metadata

if TYPE_CHECKING:
    from onetrainer.config import TrainConfig

OT_CONFIG_KEY = "ot_config"  # OneTrainer's header key for the training config


class Method(ABC):
    """A training method bound to a loaded model."""

    def __init__(self, config: TrainConfig, family: Family, model: LoadedModel, device: torch.device) -> None:
        self.config = config
        self.family = family
        self.model = model
        self.device = device
        self.parts: list[str] = []  # the model parts this method trains (LoRA and fine-tune set them)
        self._frozen_parts: set[str] = set()
        self.notices: list[str] = []  # one-line notices for the user about what the method set up (the trainer shows)
        # Header entries about the run the trainer adds to the next files written (the validation loss of a save).
        self.run_metadata: dict[str, str] = {}
        embedding_configs = self._embedding_configs()
        bundled = {}
        if config.training_method is TrainingMethod.LORA and config.lora_model_name:
            bundled = bundled_embeddings(load_state_dict(config.lora_model_name))
        # Each text encoder's "train embedding" switch decides whether its vectors of every embedding train.
        trained = [s.part for s in model.text_encoders if config.part(s.part).train_embedding]
        self.embeddings = EmbeddingSet(
            model, embedding_configs, torch_dtype(config.embedding_weight_dtype), device, bundled, trained
        )

    def _embedding_configs(self) -> list:
        if self.config.training_method is TrainingMethod.EMBEDDING:
            return [self.config.embedding]
        return list(self.config.additional_embeddings)

    # -- what trains ----------------------------------------------------------------------------------------------

    @abstractmethod
    def param_groups(self) -> list[dict]:
        """Named parameter groups (`name`, `params`, `lr`), one per trained part, adapter set or embedding."""

    def trained_parts(self) -> list[str]:
        """The model parts whose own weights or adapters train (their modules run in train mode)."""
        return []

    def backward_parts(self) -> list[str]:
        """The parts gradients flow through: the denoiser always (of several, each that trains; the first where none
        does), text encoders when they or embeddings train."""
        denoisers = [p for p in self.family.denoiser_parts if p in self.trained_parts()]
        parts = denoisers or [self.family.denoiser_part]
        for slot in self.model.text_encoders:
            if slot.part in self.trained_parts() or self.embeddings.parameters(slot.part):
                parts.append(slot.part)
        return parts

    def enable_gradient_checkpointing(self) -> list[str]:
        """Recompute activations in the backward pass of the parts that ask for it; returns their names."""
        enabled = []
        for part in self.backward_parts():
            if not self.config.part(part).gradient_checkpointing:
                continue
            module = self.model.part(part)
            if hasattr(module, "enable_gradient_checkpointing"):  # diffusers models
                offloaded = self.config.part(part).activation_offloading
                module.enable_gradient_checkpointing(offloading_checkpoint(self.device) if offloaded else None)
            elif hasattr(module, "activation_checkpointing_enable"):  # transformers models (the name since 5.x)
                module.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
            elif hasattr(module, "gradient_checkpointing_enable"):  # older transformers
                module.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            else:
                continue
            enabled.append(part)
        return enabled

    def adapters_disabled(self):
        """A context in which the model predicts as the base model (prior-prediction concepts); LoRA only."""
        raise NotImplementedError("prior-prediction concepts need the LORA training method")

    def update_freezing(self, global_step: int, epochs_done: int) -> list[str]:
        """Freeze what has reached its "stop training after"; returns the names of what was frozen now."""
        frozen = []
        for embedding in self.embeddings.embeddings:
            c = embedding.config
            if embedding.trainable and stop_after_reached(
                c.stop_training_after, c.stop_training_after_unit, global_step, epochs_done
            ):
                self.embeddings.freeze(embedding)
                frozen.append(f"embedding {embedding.placeholder}")
        for part in self.parts:
            c = self.config.part(part)
            if part not in self._frozen_parts and stop_after_reached(
                c.stop_training_after, c.stop_training_after_unit, global_step, epochs_done
            ):
                self.freeze_part(part)
                self._frozen_parts.add(part)
                frozen.append(part)
        return frozen

    def freeze_part(self, part: str) -> None:
        """Stop training a model part whose "stop training after" is reached (methods that train parts)."""
        raise NotImplementedError

    def base_lr(self, part: str | None = None) -> float:
        if part is not None and self.config.part(part).learning_rate is not None:
            return self.config.part(part).learning_rate
        return self.config.learning_rate

    def embedding_lr(self) -> float:
        lr = self.config.embedding_learning_rate
        return lr if lr is not None else self.config.learning_rate

    # -- backups --------------------------------------------------------------------------------------------------

    @abstractmethod
    def save_backup(self, folder: Path) -> None:
        """Write what trains (adapters, weights, embeddings) into a backup folder."""

    @abstractmethod
    def load_backup(self, folder: Path) -> None:
        """Restore what `save_backup` wrote."""

    def _save_embedding_state(self, folder: Path) -> None:
        if self.embeddings.embeddings:
            from safetensors.torch import save_file

            save_file(self.embeddings.state(), str(folder / "embeddings.safetensors"))

    def _load_embedding_state(self, folder: Path) -> None:
        path = folder / "embeddings.safetensors"
        if path.is_file():
            from safetensors.torch import load_file

            self.embeddings.load_state(load_file(str(path)))

    # -- the result -----------------------------------------------------------------------------------------------

    @abstractmethod
    def save_output(self, destination: Path) -> list[Path]:
        """Write the trained result in the configured format at `destination`; returns the files written."""

    def save_additional_embeddings(self, destination: Path) -> list[Path]:
        written = []
        dtype = torch_dtype(self.config.output_dtype)
        for embedding in self.embeddings.embeddings:
            path = embedding_file_path(destination, embedding.placeholder)
            save_embedding(path, self.embeddings.file_tensors(embedding, dtype), self._embedding_metadata(embedding))
            written.append(path)
        return written

    def config_metadata(self) -> dict[str, str]:
        """`include_train_config` as in OneTrainer: the config as JSON under `ot_config` in the file's header, without
        the concepts and samples (SETTINGS) or with them inline (ALL); never the secrets. And `run_metadata`."""
        part = self.config.include_train_config.value
        if part == "NONE":
            return dict(self.run_metadata)
        data = self.config.to_dict()
        data.pop("secrets", None)
        if part == "SETTINGS":
            data.pop("concepts", None)
            data.pop("samples", None)
        return {OT_CONFIG_KEY: json.dumps(data, ensure_ascii=False), **self.run_metadata}

    def training_resolution(self) -> tuple[int, int]:
        resolution = parse_resolution(self.config.resolution)
        if resolution.exact:
            return resolution.exact
        return (resolution.largest, resolution.largest)

    def _embedding_metadata(self, embedding) -> dict[str, str]:
        meta = model_metadata(
            self.family.metadata_kind(self.model),
            embedding.placeholder,
            self.training_resolution(),
            self.model.schedule.prediction,
            adapter="textual-inversion",
        )
        meta["onetrainer.placeholder"] = embedding.placeholder
        meta.update(self.config_metadata())
        return meta


def layer_filter_patterns(config: TrainConfig, family: Family) -> tuple[list[str], bool]:
    """The layer filter as (patterns, is_regex); no patterns means every layer."""
    from onetrainer.util.layer_filter import configured_patterns

    return configured_patterns(
        config.layer_filter, config.layer_filter_preset, config.layer_filter_regex, family.info.layer_presets
    )


def offloading_checkpoint(device: torch.device) -> Callable:
    """A checkpoint function for diffusers' blocks that keeps what checkpointing saves (each block's inputs) in CPU
    memory until the backward pass (`activation_offloading`): the checkpoint saves its inputs through the saved-tensor
    hooks around it, which `save_on_cpu` sets (pinned, for asynchronous copies back, on CUDA)."""
    pin = torch.device(device).type == "cuda"

    def run(block, *args):
        with torch.autograd.graph.save_on_cpu(pin_memory=pin):
            return torch.utils.checkpoint.checkpoint(block.__call__, *args, use_reentrant=False)

    return run
