"""What the tool windows that work on a model (the sampling window, the LoRA tools) take from the main window: a model
type menu under the labels the main window shows ("SD 1.5", never STABLE_DIFFUSION_15), and the file or folder the
config trains once a run has written it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import customtkinter as ctk

from gui.labels import model_type_choices
from onetrainer.config import TrainConfig
from onetrainer.config.enums import ModelType


class ModelTypeMenu(ctk.CTkOptionMenu):
    """An option menu of every model type by its label; `model_type` is the chosen one. It keeps its width whichever
    label is shown (`sticky="ew"` stretches it), so choosing a type never resizes its window. `on_change(model_type)`
    is called when the user picks one."""

    def __init__(self, master: Any, on_change: Callable[[ModelType], None] | None = None, **kwargs: Any) -> None:
        self._types = dict(model_type_choices())
        command = (lambda label: on_change(self._types[label])) if on_change is not None else None
        super().__init__(master, values=list(self._types), command=command, dynamic_resizing=False, **kwargs)

    @property
    def model_type(self) -> ModelType:
        return self._types[self.get()]

    def set_model_type(self, model_type: ModelType | str) -> None:
        """Show `model_type` (a ModelType, its name or its label); an unknown one leaves the menu as it is."""
        for label, known in self._types.items():
            if known.value == getattr(model_type, "value", model_type) or label == model_type:
                self.set(label)
                return


def trained_output(config: TrainConfig) -> str:
    """The config's output (`output_model_destination`) once a run has written it, else ""."""
    trained = config.output_model_destination.strip()
    return trained if trained and Path(trained).expanduser().exists() else ""
