"""A list editor: one row of field views per item of a config list (samples, embeddings, scheduler parameters).

Each cell is an ordinary field view bound to the item's path (`samples.2.prompt`), so typing writes into the config
exactly as in the forms. Rows may carry action buttons ("…" opening the item's full editor), a clone button and a
remove button.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import customtkinter as ctk

from gui.forms.fields import FieldView, make_view, sync_views
from gui.forms.selection import item_field
from gui.tabs.form_tab import FormTab
from gui.widgets.binding import bind_self
from gui.widgets.tooltip import add_tooltip
from onetrainer.config import pack
from onetrainer.config.schema import ConfigNode, Problem, join_path

if TYPE_CHECKING:
    from gui.dialogs import Dialogs
    from gui.model import ConfigModel

WARNING_COLOR = ("#9a6700", "#e3b341")


@dataclass(frozen=True)
class RowColumn:
    field: str  # the item's field shown in this column
    title: str
    stretch: bool = False  # takes the spare width


@dataclass(frozen=True)
class RowAction:
    text: str
    tooltip: str
    command: Callable[[int], None]  # called with the row's index


def inline_items(model: ConfigModel, list_path: str, file_field: str | None) -> tuple[list[ConfigNode], list[Problem]]:
    """The config's list, copied in from its side file first when the config has none inline.

    Editors edit the list in the config itself, so a list kept in a side file (`concept_file_name`) is read once and
    from then on held inline; the problems reading the file are returned.
    """
    config = model.config
    items = getattr(config, list_path)
    if items is not None:
        return items, []
    if file_field is None:
        items = []
        setattr(config, list_path, items)
        return items, []
    packed, problems = pack(config)
    items = getattr(packed, list_path) or []
    setattr(config, list_path, items)
    return items, [p for p in problems if p.path.split(".")[0] in (list_path, file_field)]


class RowsEditor:
    def __init__(
        self,
        parent: Any,
        model: ConfigModel,
        dialogs: Dialogs | None,
        list_path: str,
        file_field: str | None,
        columns: Sequence[RowColumn],
        new_item: Callable[[], ConfigNode],
        title: str,
        add_text: str,
        actions: Sequence[RowAction] = (),
        clone_item: Callable[[ConfigNode], ConfigNode] | None = None,
    ) -> None:
        self.model = model
        self.dialogs = dialogs
        self.list_path = list_path
        self.file_field = file_field
        self.columns = list(columns)
        self.new_item = new_item
        self.actions = list(actions)
        self.clone_item = clone_item
        self.load_problems: list[Problem] = []
        self.rows: list[list[FieldView]] = []
        self.row_buttons: list[dict[str, ctk.CTkButton]] = []

        self.frame = ctk.CTkFrame(parent)
        self.frame.grid_columnconfigure(0, weight=1)
        self.header = ctk.CTkFrame(self.frame, fg_color="transparent")
        self.header.grid(row=0, column=0, sticky="ew", padx=10, pady=(6, 2))
        self.header.grid_columnconfigure(0, weight=1)
        ctk.CTkLabel(self.header, text=title, font=ctk.CTkFont(size=14, weight="bold"), anchor="w").grid(
            row=0, column=0, sticky="w"
        )
        self.message = ctk.CTkLabel(self.frame, text="", anchor="w", justify="left", text_color=WARNING_COLOR)
        self.table = ctk.CTkFrame(self.frame, fg_color="transparent")
        self.table.grid(row=2, column=0, sticky="ew", padx=6)
        for c, column in enumerate(self.columns):
            self.table.grid_columnconfigure(c, weight=1 if column.stretch else 0)
            ctk.CTkLabel(self.table, text=column.title, anchor="w").grid(row=0, column=c, sticky="w", padx=4)
        self.empty_label = ctk.CTkLabel(self.table, text="(none yet)", anchor="w")
        self.add_button = ctk.CTkButton(self.frame, text=add_text, width=140, command=self.add)
        self.add_button.grid(row=3, column=0, sticky="w", padx=10, pady=(4, 10))
        self._unsubscribe: Callable[[], None] | None = model.subscribe(self._config_changed)
        self._unsubscribe_marks = model.subscribe_marks(self.mark)
        bind_self(self.frame, "<Destroy>", self._destroyed)
        self.refresh()

    def items(self) -> list[ConfigNode]:
        items, problems = inline_items(self.model, self.list_path, self.file_field)
        if problems:
            self.load_problems = problems
            self._show_message()
        return items

    def refresh(self) -> None:
        self.load_problems = []
        self._show_message()
        self._rebuild()

    def add(self) -> None:
        self.items().append(self.new_item())
        self.model.changed(self.list_path)  # the editor rebuilds its rows when it hears of it

    def clone(self, index: int) -> None:
        assert self.clone_item is not None
        items = self.items()
        items.insert(index + 1, self.clone_item(items[index]))
        self.model.changed(self.list_path)

    def remove(self, index: int) -> None:
        del self.items()[index]
        self.model.changed(self.list_path)

    def mark(self, problems: dict[str, str]) -> None:
        for row in self.rows:
            for view in row:
                view.set_config_problem(problems.get(view.path))

    def view(self, index: int, field: str) -> FieldView:
        return self.rows[index][[c.field for c in self.columns].index(field)]

    def button(self, index: int, text: str) -> ctk.CTkButton:
        return self.row_buttons[index][text]

    def _destroyed(self, event: Any) -> None:
        if event.widget is self.frame and self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
            self._unsubscribe_marks()
            for row in self.rows:
                for view in row:
                    self.model.report_input(view, view.path, None)

    def _config_changed(self, path: str | None) -> None:
        if self._unsubscribe is None:  # destroyed in this round of notifications
            return
        if path == self.list_path:
            self._rebuild()  # rows moved: every view's path changed
        elif path is not None:
            sync_views((view for row in self.rows for view in row), path)

    def _rebuild(self) -> None:
        for row in self.rows:
            for view in row:
                view.destroy()
        for buttons in self.row_buttons:
            for button in buttons.values():
                button.destroy()
        self.rows, self.row_buttons = [], []
        items = self.items()
        for i, item in enumerate(items):
            row: list[FieldView] = []
            for c, column in enumerate(self.columns):
                view = make_view(
                    self.table, item_field(item, self.list_path, i, column.field), self.model, self.dialogs, False
                )
                if view is None:
                    raise TypeError(f"{join_path(self.list_path, column.field)} has no widget for its type")
                view.input.grid(row=i + 1, column=c, sticky="ew" if column.stretch else "w", padx=4, pady=2)
                view.visible = True
                row.append(view)
            self.rows.append(row)
            self.row_buttons.append(self._row_buttons(i))
        self.mark(self.model.marks)
        if items:
            self.empty_label.grid_remove()
        else:
            self.empty_label.grid(row=1, column=0, columnspan=len(self.columns), sticky="w", padx=4)

    def _row_buttons(self, index: int) -> dict[str, ctk.CTkButton]:
        buttons: list[tuple[str, str, Callable[[], None]]] = [
            (a.text, a.tooltip, lambda a=a: a.command(index)) for a in self.actions
        ]
        if self.clone_item is not None:
            buttons.append(("+", "Clone this row (a copy below it)", lambda: self.clone(index)))
        buttons.append(("✕", "Remove this row", lambda: self.remove(index)))
        out = {}
        for offset, (text, tooltip, command) in enumerate(buttons):
            button = ctk.CTkButton(self.table, text=text, width=28, command=command)
            button.grid(row=index + 1, column=len(self.columns) + offset, padx=(0 if offset else 4, 4), pady=2)
            add_tooltip(button, tooltip)
            out[text] = button
        return out

    def _show_message(self) -> None:
        show_load_problems(self.message, self.load_problems)


class RowsFormTab(FormTab):
    """A form tab with a list of rows under its fields (samples, additional embeddings): the rows follow the tab's
    refreshes and problem marks. Subclasses set `self.editor`."""

    editor: RowsEditor

    def refresh(self) -> None:
        super().refresh()
        self.editor.refresh()

    def mark(self, problems: dict[str, str]) -> None:
        super().mark(problems)
        self.editor.mark(problems)


def show_load_problems(message, problems: list) -> None:
    """Show why a list file (concepts, samples) could not be read fully under its table, or hide the label."""
    if problems:
        message.configure(text="\n".join(str(p) for p in problems))
        message.grid(row=1, column=0, sticky="w", padx=10)
    else:
        message.grid_remove()
