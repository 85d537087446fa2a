"""The model families: an explicit registry from family key to the class implementing it (`registry.py`, whose
`FAMILY_CLASSES` this package re-exports), and loading a model type's class.

Entries are import paths so that reading the registry (the GUI, validation) does not import torch.
A family without an entry is known to the config (see `onetrainer.config.model_types`) but not trainable yet.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from onetrainer.config.enums import ModelType
from onetrainer.config.model_types import MODEL_TYPES
from onetrainer.families.registry import FAMILY_CLASSES

__all__ = ["FAMILY_CLASSES", "is_trainable", "load_family_class", "not_trainable_reason", "register_family"]


def register_family(key: str, target: str) -> Callable[[], None]:
    """Make the family `key` trainable: `target` is its class's import path ("package.module:Class").

    A family written outside this package calls this with `config.model_types.register_model_type` (its parts come
    with its `FamilyInfo`); returns the undo, for tests.
    """
    module_name, colon, class_name = target.partition(":")
    if not (module_name and colon and class_name):
        raise ValueError(f"family {key!r}: expected 'package.module:Class', got {target!r}")
    previous = FAMILY_CLASSES.get(key)
    FAMILY_CLASSES[key] = target

    def undo() -> None:
        if previous is None:
            FAMILY_CLASSES.pop(key, None)
        else:
            FAMILY_CLASSES[key] = previous

    return undo


def is_trainable(model_type: ModelType) -> bool:
    info = MODEL_TYPES.get(model_type)
    return info is not None and info.family.key in FAMILY_CLASSES


def not_trainable_reason(model_type: ModelType) -> str | None:
    """None when the model type can be trained; else a message for the user."""
    info = MODEL_TYPES.get(model_type)
    if info is None:
        from onetrainer.config.validation import model_type_not_built

        return model_type_not_built(model_type)
    if info.family.key not in FAMILY_CLASSES:
        return f"{info.label} ({info.family.label}) cannot be trained yet: its model family is not implemented yet"
    return None


def load_family_class(model_type: ModelType) -> type:
    reason = not_trainable_reason(model_type)
    if reason:
        raise NotImplementedError(reason)
    module_name, _, class_name = FAMILY_CLASSES[MODEL_TYPES[model_type].family.key].partition(":")
    return getattr(importlib.import_module(module_name), class_name)
