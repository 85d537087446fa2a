"""The EMBEDDING method: only the embedding's vectors train; the result is an A1111-style embedding file."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from onetrainer.methods.base import Method
from onetrainer.precision.dtypes import torch_dtype
from onetrainer.weights.embedding_file import save_embedding

if TYPE_CHECKING:
    from onetrainer.config import TrainConfig


class EmbeddingMethod(Method):
    def __init__(self, config: TrainConfig, family, model, device) -> None:
        super().__init__(config, family, model, device)
        for module in model.parts.values():
            module.requires_grad_(False)
        if self.embedding.trainable and not self.embeddings.parameters():
            raise ValueError(
                "no text encoder trains the embedding: turn on 'Train embedding' for at least one text encoder"
            )

    @property
    def embedding(self):
        return self.embeddings.embeddings[0]

    def param_groups(self) -> list[dict]:
        return self.embeddings.param_groups(self.embedding_lr())

    def save_backup(self, folder: Path) -> None:
        self._save_embedding_state(folder)

    def load_backup(self, folder: Path) -> None:
        self._load_embedding_state(folder)

    def save_output(self, destination: Path) -> list[Path]:
        tensors = self.embeddings.file_tensors(self.embedding, torch_dtype(self.config.output_dtype))
        save_embedding(destination, tensors, self._embedding_metadata(self.embedding))
        return [destination]
