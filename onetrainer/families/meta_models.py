"""Models built from their configs alone, on the meta device when asked (shapes and dtypes, no memory, no weights):
the released full-size parts of a model type (as its family declares them) and the class a config names.

The estimate (`training/estimate.py`) builds the model to be trained this way to count and measure it without
loading it, and the tiny test models (`onetrainer/tiny/`) instantiate their configs with the same calls.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

from onetrainer.families.reference_configs import Config


def init_kwargs(config: Config) -> Config:
    """A diffusers config without its bookkeeping entries (`_class_name`, ...), ready for the class's __init__."""
    return {k: v for k, v in config.items() if not k.startswith("_")}


def model_class(config: Config) -> type[torch.nn.Module]:
    """The class a config describes: `_module` + `_class_name` for our own modules, `_class_name` for diffusers,
    `architectures` for transformers."""
    if "_module" in config:
        return getattr(importlib.import_module(config["_module"]), config["_class_name"])
    from onetrainer.util.threads import library_attribute

    if "_class_name" in config:
        name = config["_class_name"]
        try:
            return library_attribute("diffusers", name)
        except AttributeError:  # Würstchen's models live among diffusers' deprecated pipelines
            return library_attribute("diffusers.pipelines.deprecated.wuerstchen", name)
    return library_attribute("transformers", config["architectures"][0])


def instantiate(config: Config) -> torch.nn.Module:
    """A model with freshly initialised weights from a config dict (under `torch.device("meta")`, without any)."""
    cls = model_class(config)
    if "_class_name" in config and "architectures" not in config:
        return cls(**init_kwargs(config))
    return cls(cls.config_class(**config))


def is_model_config(config: Any) -> bool:
    """Whether a dict describes a model (not a tokenizer's or a scheduler's)."""
    return (
        isinstance(config, dict)
        and ("architectures" in config or "_class_name" in config)
        and not (str(config.get("_class_name", "")).endswith("Scheduler"))
    )


def released_parts(model_type: Any, base_model_name: str = "") -> dict[str, Config]:
    """The full-size configs of a model type's parts (`ModelTypeInfo.released_parts`, the family's declaration; the
    variant `base_model_name` names, where its type has several); ValueError for a type without a reference model."""
    from onetrainer.config.enums import ModelType
    from onetrainer.config.model_types import MODEL_TYPES

    key = getattr(model_type, "value", model_type)
    info = MODEL_TYPES.get(ModelType(key)) if key in ModelType.__members__ else None
    if info is None or not info.released_parts:
        raise ValueError(f"no reference model for {key}")
    name = base_model_name.lower()
    for word, parts in info.released_variants:
        if word in name:
            return {**info.released_parts, **parts}
    return dict(info.released_parts)
