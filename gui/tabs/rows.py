"""A simple list editor: one row of field views per item of a config list (concepts, samples), add and remove.

Each cell is an ordinary field view bound to the item's path (`concepts.2.path`), so typing writes into the config
exactly as in the forms. Later steps replace these rows with concept cards and a full sample editor.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import customtkinter as ctk

from gui.forms.fields import FieldView, make_view
from gui.forms.selection import item_field
from onetrainer.config import pack
from onetrainer.config.schema import ConfigNode, Problem

if TYPE_CHECKING:
    from gui.dialogs import Dialogs
    from gui.model import ConfigModel


@dataclass(frozen=True)
class RowColumn:
    field: str  # the item's field shown in this column
    title: str
    stretch: bool = False  # takes the spare width


class RowsEditor:
    def __init__(
        self,
        parent: Any,
        model: ConfigModel,
        dialogs: Dialogs | None,
        list_path: str,
        file_field: str,
        columns: Sequence[RowColumn],
        new_item: Callable[[], ConfigNode],
        title: str,
        add_text: str,
    ) -> None:
        self.model = model
        self.dialogs = dialogs
        self.list_path = list_path
        self.file_field = file_field
        self.columns = list(columns)
        self.new_item = new_item
        self.load_problems: list[Problem] = []
        self.rows: list[list[FieldView]] = []
        self.remove_buttons: list[ctk.CTkButton] = []

        self.frame = ctk.CTkFrame(parent)
        self.frame.grid_columnconfigure(0, weight=1)
        ctk.CTkLabel(self.frame, text=title, font=ctk.CTkFont(size=14, weight="bold"), anchor="w").grid(
            row=0, column=0, sticky="w", padx=10, pady=(6, 2)
        )
        self.message = ctk.CTkLabel(self.frame, text="", anchor="w", justify="left", text_color=("#9a6700", "#e3b341"))
        self.table = ctk.CTkFrame(self.frame, fg_color="transparent")
        self.table.grid(row=2, column=0, sticky="ew", padx=6)
        for c, column in enumerate(self.columns):
            self.table.grid_columnconfigure(c, weight=1 if column.stretch else 0)
            ctk.CTkLabel(self.table, text=column.title, anchor="w").grid(row=0, column=c, sticky="w", padx=4)
        self.empty_label = ctk.CTkLabel(self.table, text="(none yet)", anchor="w")
        self.add_button = ctk.CTkButton(self.frame, text=add_text, width=140, command=self.add)
        self.add_button.grid(row=3, column=0, sticky="w", padx=10, pady=(4, 10))
        self.refresh()

    def items(self) -> list[ConfigNode]:
        """The config's list, read from its side file first when the config has none inline."""
        config = self.model.config
        items = getattr(config, self.list_path)
        if items is None:
            # The editor edits the list in the config itself, so the side file's items are copied in (inline).
            packed, problems = pack(config)
            items = getattr(packed, self.list_path) or []
            setattr(config, self.list_path, items)
            self.load_problems = [p for p in problems if p.path.split(".")[0] in (self.list_path, self.file_field)]
            self._show_message()
        return items

    def refresh(self) -> None:
        self.load_problems = []
        self._show_message()
        self._rebuild()

    def update_context(self) -> None:
        pass

    def add(self) -> None:
        self.items().append(self.new_item())
        self.model.changed(self.list_path)
        self._rebuild()

    def remove(self, index: int) -> None:
        del self.items()[index]
        self.model.changed(self.list_path)
        self._rebuild()

    def mark(self, problems: dict[str, str]) -> None:
        for row in self.rows:
            for view in row:
                view.set_config_problem(problems.get(view.path))

    def view(self, index: int, field: str) -> FieldView:
        return self.rows[index][[c.field for c in self.columns].index(field)]

    def _rebuild(self) -> None:
        for row in self.rows:
            for view in row:
                view.destroy()
        for button in self.remove_buttons:
            button.destroy()
        self.rows, self.remove_buttons = [], []
        items = self.items()
        for i, item in enumerate(items):
            row: list[FieldView] = []
            for c, column in enumerate(self.columns):
                view = make_view(
                    self.table, item_field(item, self.list_path, i, column.field), self.model, self.dialogs, False
                )
                if view is None:
                    raise TypeError(f"{self.list_path}.{column.field} has no widget for its type")
                view.input.grid(row=i + 1, column=c, sticky="ew" if column.stretch else "w", padx=4, pady=2)
                view.visible = True
                row.append(view)
            button = ctk.CTkButton(self.table, text="✕", width=28, command=lambda index=i: self.remove(index))
            button.grid(row=i + 1, column=len(self.columns), padx=4, pady=2)
            self.rows.append(row)
            self.remove_buttons.append(button)
        if items:
            self.empty_label.grid_remove()
        else:
            self.empty_label.grid(row=1, column=0, columnspan=len(self.columns), sticky="w", padx=4)

    def _show_message(self) -> None:
        if self.load_problems:
            self.message.configure(text="\n".join(str(p) for p in self.load_problems))
            self.message.grid(row=1, column=0, sticky="w", padx=10)
        else:
            self.message.grid_remove()
