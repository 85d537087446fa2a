"""Friendly names for the top bar's menus, read from the model table and the family registry (no Tk)."""

from __future__ import annotations

from onetrainer.config.enums import ModelType, TrainingMethod
from onetrainer.config.model_types import MODEL_TYPES, SUPPORTED_MODEL_TYPES
from onetrainer.families import is_trainable

NOT_TRAINABLE_SUFFIX = " (not trainable yet)"
NOT_SUPPORTED_SUFFIX = " (not trainable yet)"  # one of OneTrainer's model types whose family is not built here

METHOD_LABELS = {
    TrainingMethod.FINE_TUNE: "Fine Tune",
    TrainingMethod.LORA: "LoRA",
    TrainingMethod.EMBEDDING: "Embedding",
}


def model_type_label(model_type: ModelType) -> str:
    info = MODEL_TYPES.get(model_type)
    if info is None:
        return model_type.value + NOT_SUPPORTED_SUFFIX
    return info.label + ("" if is_trainable(model_type) else NOT_TRAINABLE_SUFFIX)


def model_type_choices() -> list[tuple[str, ModelType]]:
    """(label, model type) for every model type the config knows, trainable or not (those are marked)."""
    return [(model_type_label(mt), mt) for mt in SUPPORTED_MODEL_TYPES]


def method_label(method: TrainingMethod) -> str:
    return METHOD_LABELS.get(method, method.value)


def offered_methods(model_type: ModelType) -> tuple[TrainingMethod, ...]:
    """The training methods the model type's family offers (the SD 1.5 family's for an unknown model type)."""
    info = MODEL_TYPES.get(model_type) or MODEL_TYPES[ModelType.STABLE_DIFFUSION_15]
    return info.family.methods
