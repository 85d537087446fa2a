"""A sample's full editor ("…" on its row): every SampleConfig field, generated from the declarations."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import customtkinter as ctk

from gui.forms.form import Form
from gui.forms.selection import node_fields
from gui.widgets.problem_line import ProblemLine
from gui.window_position import place_over

if TYPE_CHECKING:
    from gui.dialogs import Dialogs
    from gui.model import ConfigModel

LIST_PATH = "samples"


class SampleEditorWindow(ctk.CTkToplevel):
    def __init__(self, master: Any, model: ConfigModel, dialogs: Dialogs | None, index: int) -> None:
        super().__init__(master)
        self.model = model
        self.index = index
        self._closed = False
        # Before the form subscribes: a change of the list closes the window before the form reads moved paths.
        self._unsubscribe = model.subscribe(self._config_changed)
        self.title(f"Sample {index + 1}")
        place_over(self, master, (620, 640))
        self.minsize(480, 400)
        self.grid_columnconfigure(0, weight=1)
        self.grid_rowconfigure(0, weight=1)
        scroll = ctk.CTkScrollableFrame(self, fg_color="transparent")
        scroll.grid(row=0, column=0, sticky="nsew", padx=8, pady=8)
        scroll.grid_columnconfigure(0, weight=1)
        sample = model.config.samples[index]
        fields = node_fields(sample, f"{LIST_PATH}.{index}")
        self.form = Form(scroll, model, dialogs, "sample", columns=1, default_group="Sample", fields=fields)
        self.form.frame.grid(row=0, column=0, sticky="ew")
        bottom = ctk.CTkFrame(self, fg_color="transparent")
        bottom.grid(row=1, column=0, sticky="ew", padx=12, pady=(0, 10))
        bottom.grid_columnconfigure(0, weight=1)
        self.problem_line = ProblemLine(bottom, model, f"{LIST_PATH}.{index}")
        self.problem_line.label.grid(row=0, column=0, sticky="ew")
        ctk.CTkButton(bottom, text="Close", width=100, command=self.close).grid(row=0, column=1, sticky="e")
        self.protocol("WM_DELETE_WINDOW", self.close)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._unsubscribe()
            self.destroy()

    def _config_changed(self, path: str | None) -> None:
        if path is None or path == LIST_PATH:
            self.close()
