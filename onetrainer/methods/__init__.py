"""Training methods, written once for every family: LoRA, fine-tune, embedding (and additional embeddings)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from onetrainer.config.enums import TrainingMethod

if TYPE_CHECKING:
    from onetrainer.config import TrainConfig


def create_method(config: TrainConfig, family, model, device):
    from onetrainer.methods.finetune import FineTuneMethod
    from onetrainer.methods.lora import LoraMethod
    from onetrainer.methods.textual_inversion import EmbeddingMethod

    methods = {
        TrainingMethod.FINE_TUNE: FineTuneMethod,
        TrainingMethod.LORA: LoraMethod,
        TrainingMethod.EMBEDDING: EmbeddingMethod,
    }
    try:
        cls = methods[config.training_method]
    except KeyError:
        raise NotImplementedError(f"the training method {config.training_method.value} is not supported") from None
    return cls(config, family, model, device)
