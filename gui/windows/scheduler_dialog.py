"""The LR scheduler's "…" dialog: a CUSTOM scheduler's class and its keyword arguments (key / value rows)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import customtkinter as ctk

from gui.forms.fields import EntryView
from gui.forms.selection import node_field
from gui.tabs.rows import RowColumn, RowsEditor
from gui.window_position import place_over
from onetrainer.config.train_config import SchedulerParameter

if TYPE_CHECKING:
    from gui.dialogs import Dialogs
    from gui.model import ConfigModel

MUTED_TEXT = ("gray40", "gray60")
CLASS_PATH = "custom_learning_rate_scheduler"
PARAMS_PATH = "scheduler_params"


class SchedulerDialog(ctk.CTkToplevel):
    def __init__(self, master: Any, model: ConfigModel, dialogs: Dialogs | None) -> None:
        super().__init__(master)
        self.model = model
        self.title("Learning rate scheduler")
        place_over(self, master, (640, 480))
        self.minsize(480, 320)
        self.grid_columnconfigure(0, weight=1)
        self.grid_rowconfigure(2, weight=1)
        note = (
            "Used when the learning rate scheduler is CUSTOM. Values are Python literals or one of %LR%, %EPOCHS%, "
            "%STEPS_PER_EPOCH%, %TOTAL_STEPS%, %SCHEDULER_STEPS%."
        )
        ctk.CTkLabel(self, text=note, text_color=MUTED_TEXT, wraplength=600, justify="left", anchor="w").grid(
            row=0, column=0, sticky="ew", padx=14, pady=(12, 4)
        )
        top = ctk.CTkFrame(self)
        top.grid(row=1, column=0, sticky="ew", padx=10, pady=4)
        top.grid_columnconfigure(1, weight=1)
        self.class_view = EntryView(top, node_field(model.config, "", CLASS_PATH), model, dialogs)
        self.class_view.place(0)
        scroll = ctk.CTkScrollableFrame(self, fg_color="transparent")
        scroll.grid(row=2, column=0, sticky="nsew", padx=6, pady=4)
        scroll.grid_columnconfigure(0, weight=1)
        self.parameters = RowsEditor(
            scroll,
            model,
            dialogs,
            list_path=PARAMS_PATH,
            file_field=None,
            columns=(RowColumn("key", "Key"), RowColumn("value", "Value", stretch=True)),
            new_item=SchedulerParameter,
            title="Arguments",
            add_text="+ Add argument",
        )
        self.parameters.frame.grid(row=0, column=0, sticky="ew")
        ctk.CTkButton(self, text="Close", width=100, command=self.close).grid(
            row=3, column=0, sticky="e", padx=12, pady=(0, 10)
        )
        self._unsubscribe = model.subscribe(self._config_changed)
        self.protocol("WM_DELETE_WINDOW", self.close)

    def close(self) -> None:
        if self.winfo_exists():
            self._unsubscribe()
            self.class_view.destroy()  # its input no longer holds anything back
            self.destroy()

    def _config_changed(self, path: str | None) -> None:
        if path is None:  # another config: its values are not the ones shown
            self.close()
        elif self.class_view.watches(path):
            self.class_view.sync()
