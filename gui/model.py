"""The app's one config object, and the listeners told when it changes.

Widgets never keep config values of their own: they read and write the config through dotted paths here, so loading
a preset (which replaces the whole config) only needs a `refresh()` of every view.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from onetrainer.config import TrainConfig
from onetrainer.config.schema import Context, Problem, get_path, set_path
from onetrainer.config.validation import context_of

# A listener gets the changed path, or None when the whole config was replaced.
Listener = Callable[[str | None], None]
# A marks listener gets validation's message by path (every window's forms show them).
MarksListener = Callable[[dict[str, str]], None]


@dataclass(frozen=True)
class InputError:
    """An input (in any window) whose text is not a valid value: the config still holds the last valid one."""

    path: str
    message: str


# The fields that decide which other fields apply (see `context_of`).
CONTEXT_PATHS = frozenset({"model_type", "training_method"})


class ConfigModel:
    def __init__(self, config: TrainConfig | None = None) -> None:
        self._config = config if config is not None else TrainConfig()
        self._listeners: list[Listener] = []
        self._mark_listeners: list[MarksListener] = []
        self._input_listeners: list[Callable[[InputError], None]] = []
        self._input_errors: dict[int, InputError] = {}  # by the id of the view showing it
        self.marks: dict[str, str] = {}
        self.revision = 0  # counts edits; compared with `saved_revision` to know about unsaved changes
        self.saved_revision = 0

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
        # Every view shows the new config's value (tabs not on screen when they are next selected): no input
        # holds back a value any more.
        self._input_errors.clear()
        self._notify(None)
        self.mark_saved()

    # -- unsaved changes ---------------------------------------------------------------------------------------

    @property
    def unsaved(self) -> bool:
        """Whether the config was edited since it was loaded or saved."""
        return self.revision != self.saved_revision

    def mark_saved(self) -> None:
        self.saved_revision = self.revision

    # -- inputs that are not valid values, and validation's marks ----------------------------------------------

    def report_input(self, owner: object, path: str, message: str | None) -> None:
        """Remember (or, with None, forget) that `owner`'s input for `path` is not a valid value."""
        old = self._input_errors.get(id(owner))
        if message is None:
            self._input_errors.pop(id(owner), None)
        else:
            self._input_errors[id(owner)] = InputError(path, message)
        new = self._input_errors.get(id(owner))
        if new != old:
            for listener in list(self._input_listeners):
                listener(new or InputError(path, ""))

    def subscribe_inputs(self, listener: Callable[[InputError], None]) -> Callable[[], None]:
        """Hear of inputs turning invalid (the error) or valid again (an empty message)."""
        self._input_listeners.append(listener)
        return lambda: self._input_listeners.remove(listener)

    def input_errors(self) -> list[InputError]:
        """Every input in every window that holds text the config did not take, one per path."""
        by_path: dict[str, InputError] = {}
        for error in self._input_errors.values():
            by_path.setdefault(error.path, error)
        return list(by_path.values())

    def set_marks(self, marks: dict[str, str]) -> None:
        """Validation's messages by path, shown by every form (the tabs', and open windows')."""
        self.marks = marks
        for listener in list(self._mark_listeners):
            listener(marks)

    def subscribe_marks(self, listener: MarksListener) -> Callable[[], None]:
        self._mark_listeners.append(listener)
        return lambda: self._mark_listeners.remove(listener)

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    def _notify(self, path: str | None) -> None:
        if path is not None:
            self.revision += 1
        for listener in list(self._listeners):
            listener(path)
