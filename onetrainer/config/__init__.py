"""The one config: fields with metadata, enums, JSON load/save, presets, migrations, validation."""

from onetrainer.config.concept_config import ConceptConfig, ConceptImageConfig, ConceptTextConfig
from onetrainer.config.embedding_config import TrainEmbeddingConfig
from onetrainer.config.enums import ModelFormat, ModelType, TrainingMethod
from onetrainer.config.io import (
    ConfigFileError,
    config_from_dict,
    list_presets,
    load_config,
    load_layers,
    load_preset,
    pack,
    save_config,
)
from onetrainer.config.optimizer_config import TrainOptimizerConfig
from onetrainer.config.parts import ModelPartConfig
from onetrainer.config.sample_config import SampleConfig
from onetrainer.config.schema import Problem, Severity, errors, warnings
from onetrainer.config.train_config import TrainConfig
from onetrainer.config.validation import context_of, validate

__all__ = [
    "ConceptConfig",
    "ConceptImageConfig",
    "ConceptTextConfig",
    "ConfigFileError",
    "ModelFormat",
    "ModelPartConfig",
    "ModelType",
    "Problem",
    "SampleConfig",
    "Severity",
    "TrainConfig",
    "TrainEmbeddingConfig",
    "TrainOptimizerConfig",
    "TrainingMethod",
    "config_from_dict",
    "context_of",
    "errors",
    "list_presets",
    "load_config",
    "load_layers",
    "load_preset",
    "pack",
    "save_config",
    "validate",
    "warnings",
]
