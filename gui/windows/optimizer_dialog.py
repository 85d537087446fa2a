"""The optimizer's "…" dialog: its parameters, generated from the optimizer table, with "Load defaults".

Values live in `config.optimizer.<name>`; an empty field (None) means the table's default, shown beside it. Closing the
dialog remembers the settings for this optimizer (`optim.remember_optimizer_settings`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import customtkinter as ctk

from gui.forms.fields import BoolView, FieldView, JsonObjectView, make_view
from gui.forms.selection import node_field
from gui.forms.values import display_text
from gui.widgets.problem_line import ProblemLine
from gui.window_position import place_over

if TYPE_CHECKING:
    from gui.model import ConfigModel

MUTED_TEXT = ("gray40", "gray60")
BLOCK = "optimizer"


class DefaultedBoolView(BoolView):
    """A switch for a `bool | None` parameter: None shows the table's default."""

    def __init__(self, *args: Any, default: bool, **kwargs: Any) -> None:
        self.default = default
        super().__init__(*args, **kwargs)

    def _load(self, value: Any) -> None:
        super()._load(self.default if value is None else value)


class OptimizerDialog(ctk.CTkToplevel):
    def __init__(self, master: Any, model: ConfigModel) -> None:
        super().__init__(master)
        self.model = model
        self.views: dict[str, FieldView] = {}
        self.defaults: dict[str, Any] = {}
        self._closed = False
        self._unsubscribe = model.subscribe(self._config_changed)
        place_over(self, master, (560, 620))
        self.minsize(440, 320)
        self.grid_columnconfigure(0, weight=1)
        self.grid_rowconfigure(1, weight=1)
        self.heading = ctk.CTkLabel(self, text="", font=ctk.CTkFont(size=15, weight="bold"), anchor="w")
        self.heading.grid(row=0, column=0, sticky="ew", padx=14, pady=(12, 2))
        self.scroll = ctk.CTkScrollableFrame(self)
        self.scroll.grid(row=1, column=0, sticky="nsew", padx=10, pady=6)
        buttons = ctk.CTkFrame(self, fg_color="transparent")
        buttons.grid(row=2, column=0, sticky="ew", padx=12, pady=(0, 10))
        self.defaults_button = ctk.CTkButton(buttons, text="Load defaults", width=120, command=self.load_defaults)
        self.defaults_button.pack(side="left")
        ctk.CTkButton(buttons, text="Close", width=100, command=self.close).pack(side="right")
        # Messages go to this line, never into the table: its columns stay where they are.
        self.problem_line = ProblemLine(buttons, model, BLOCK)
        self.problem_line.label.pack(side="left", fill="x", expand=True, padx=10)
        self.protocol("WM_DELETE_WINDOW", self.close)
        self._optimizer = None
        self.build()

    def build(self) -> None:
        """Rows for the chosen optimizer's parameters (again after the optimizer changed)."""
        from onetrainer.training import optim

        for view in self.views.values():
            view.destroy()
        for child in self.scroll.winfo_children():
            child.destroy()
        self.views, self.defaults = {}, {}
        optimizer = self.model.config.optimizer.optimizer
        self._optimizer = optimizer
        self.title(f"Optimizer: {optimizer.value}")
        self.heading.configure(text=f"{optimizer.value} parameters")
        self.scroll.grid_columnconfigure(2, weight=1)  # the defaults sit beside the inputs
        block = self.model.config.optimizer
        rows = optim.dialog_parameters(optimizer)
        if not rows:
            ctk.CTkLabel(self.scroll, text="This optimizer has no parameters to set.").grid(row=0, column=0, sticky="w")
        for row, parameter in enumerate(rows):
            info = node_field(block, BLOCK, parameter.name)
            view: FieldView | None
            if parameter.kind == "bool":
                view = DefaultedBoolView(self.scroll, info, self.model, None, default=parameter.default)
            elif parameter.kind == "dict":  # Muon's auxiliary Adam settings: a JSON object
                view = JsonObjectView(self.scroll, info, self.model, None)
            else:
                view = make_view(self.scroll, info, self.model, None)
            if view is None:
                continue
            view.place(row)
            text = f"default {display_text(parameter.default)}"
            default = ctk.CTkLabel(self.scroll, text=text, text_color=MUTED_TEXT)
            default.grid(row=row, column=2, sticky="w", padx=(12, 10))
            self.views[parameter.name] = view
            self.defaults[parameter.name] = parameter.default

    def load_defaults(self) -> None:
        """The table's values for this optimizer, forgetting the remembered ones."""
        from onetrainer.training import optim

        optim.load_optimizer_defaults(self.model.config)
        self.model.changed(BLOCK)

    def close(self) -> None:
        if self._closed:
            return
        from onetrainer.training import optim

        self._closed = True
        self._unsubscribe()
        for view in self.views.values():  # its inputs no longer hold anything back
            view.destroy()
        optim.remember_optimizer_settings(self.model.config)
        self.destroy()

    def _config_changed(self, path: str | None) -> None:
        if self._closed:
            return
        if path is None:
            self.close()
        elif self.model.config.optimizer.optimizer is not self._optimizer:
            self.build()
        elif path == BLOCK or path.startswith(BLOCK + "."):
            for view in self.views.values():
                if view.watches(path):
                    view.sync()
