"""A window's status line: the first problem of the fields it edits, on one line of fixed height.

Forms show no message under a field (it would move the fields below while the user types); windows without the
main window's footer show it here instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import customtkinter as ctk

from gui.widgets.binding import bind_self
from onetrainer.config.naming import field_name

if TYPE_CHECKING:
    from gui.model import ConfigModel, InputError

ERROR_TEXT = ("#b03a2e", "#ff7b72")


class ProblemLine:
    def __init__(self, parent: Any, model: ConfigModel, prefix: str) -> None:
        self.model = model
        self.prefix = prefix
        self.label = ctk.CTkLabel(parent, text="", text_color=ERROR_TEXT, anchor="w", height=24)
        self._unsubscribes: list[Callable[[], None]] = [
            model.subscribe_inputs(self._input_changed),
            model.subscribe_marks(lambda _marks: self.update()),
        ]
        bind_self(self.label, "<Destroy>", self._destroyed)
        self.update()

    @property
    def text(self) -> str:
        return self.label.cget("text")

    def _mine(self, path: str) -> bool:
        return path == self.prefix or path.startswith(self.prefix + ".")

    def _input_changed(self, _error: InputError) -> None:
        self.update()

    def update(self) -> None:
        config = self.model.config
        inputs = [e for e in self.model.input_errors() if self._mine(e.path)]
        if inputs:
            text = f"{field_name(config, inputs[0].path)}: {inputs[0].message}"
        else:
            marked = [(p, m) for p, m in self.model.marks.items() if self._mine(p)]
            text = f"{field_name(config, marked[0][0])}: {marked[0][1]}" if marked else ""
        self.label.configure(text=text)

    def _destroyed(self, _event: Any) -> None:
        for unsubscribe in self._unsubscribes:
            unsubscribe()
        self._unsubscribes = []
