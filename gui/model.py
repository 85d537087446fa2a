"""The app's one config object, and the listeners told when it changes.

Widgets never keep config values of their own: they read and write the config through dotted paths here, so loading
a preset (which replaces the whole config) only needs a `refresh()` of every view.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from onetrainer.config import TrainConfig
from onetrainer.config.schema import Context, Problem, get_path, set_path
from onetrainer.config.validation import context_of

# A listener gets the changed path, or None when the whole config was replaced.
Listener = Callable[[str | None], None]

# The fields that decide which other fields apply (see `context_of`).
CONTEXT_PATHS = frozenset({"model_type", "training_method"})


class ConfigModel:
    def __init__(self, config: TrainConfig | None = None) -> None:
        self._config = config if config is not None else TrainConfig()
        self._listeners: list[Listener] = []

    @property
    def config(self) -> TrainConfig:
        return self._config

    def context(self) -> Context:
        return context_of(self._config)

    def get(self, path: str) -> Any:
        return get_path(self._config, path)

    def set(self, path: str, value: Any) -> list[Problem]:
        """Set a field from a JSON-ish value (enum members by name); listeners hear of it only when it was set."""
        problems = set_path(self._config, path, value)
        if not any(p.is_error for p in problems):
            self._notify(path)
        return problems

    def changed(self, path: str) -> None:
        """Tell listeners about an edit made directly on the config objects (adding or removing list items)."""
        self._notify(path)

    def replace(self, config: TrainConfig) -> None:
        self._config = config
        self._notify(None)

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    def _notify(self, path: str | None) -> None:
        for listener in list(self._listeners):
            listener(path)
