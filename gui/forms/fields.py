"""Field views: the widgets of one config field, chosen from its type and metadata and bound to it by path.

bool → switch; enum or `choices` → option menu; int / float → validated entry (empty = None when nullable);
str → entry; `widget` file / dir / path / model → entry + "…" browse button; a `unit` → value entry + unit menu.

A view writes into the config as soon as its input is a valid value and never otherwise; an invalid input is marked
(red border, the message in the tooltip and in the window's status line) and the config keeps its last valid value.
The model keeps the list of such inputs: Start and Save refuse while it is not empty. No message is put into the form
itself: a line appearing under a field would move every field below it while the user types.
"""

from __future__ import annotations

import json
import tkinter
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import customtkinter as ctk

from gui.dialogs import MODEL_FILES
from gui.forms.selection import FieldInfo
from gui.forms.values import (
    check_value,
    choice_label,
    choice_options,
    display_text,
    parse_number,
    to_json,
)
from gui.widgets.tooltip import add_tooltip

if TYPE_CHECKING:
    from gui.dialogs import Dialogs
    from gui.model import ConfigModel

ERROR_COLOR = ("#c0392b", "#ff6b6b")
LABEL_WIDTH = 170
NUMBER_WIDTH = 110
UNIT_WIDTH = 100
BROWSE_WIDTH = 30
PATH_WIDGETS = frozenset({"file", "files", "dir", "path", "model"})


class FieldView:
    """One field: an optional label and its input widgets, in a grid `parent`.

    With `with_label` (forms), `place(row)` grids the label in column 0 and the input in column 1. Without (the rows
    of the list editors), the caller grids `input` itself. Errors show as the border and in the tooltip.
    """

    def __init__(
        self, parent: Any, info: FieldInfo, model: ConfigModel, dialogs: Dialogs | None, with_label: bool = True
    ) -> None:
        self.info = info
        self.path = info.path
        self.model = model
        self.dialogs = dialogs
        self.input_error: str | None = None  # the input cannot become a valid value (it was not written)
        self.config_problem: str | None = None  # validation's message about the value in the config
        self._loading = False
        self._row: int | None = None
        self.visible = False
        self.label: ctk.CTkLabel | None = None
        if with_label:
            self.label = ctk.CTkLabel(
                parent, text=info.meta.label or info.spec.name, anchor="w", justify="left", wraplength=LABEL_WIDTH
            )
        self.input = ctk.CTkFrame(parent, fg_color="transparent")
        self._build(self.input)
        targets = [w for w in (self.label, *self._tooltip_targets()) if w is not None]
        self.tooltips = add_tooltip(targets, self.tooltip_text)
        self.refresh()

    # -- subclass hooks ----------------------------------------------------------------------------------------

    def _build(self, frame: ctk.CTkFrame) -> None:
        raise NotImplementedError

    def _load(self, value: Any) -> None:
        """Show the config's value in the widgets (called with `_loading` set, so no write happens)."""
        raise NotImplementedError

    def _tooltip_targets(self) -> list[Any]:
        return list(self.input.winfo_children())

    def _mark(self, bad: bool) -> None:
        """Show or clear the error look of the input."""

    # -- layout ------------------------------------------------------------------------------------------------

    def place(self, row: int) -> None:
        self._row = row
        self.show()

    def show(self) -> None:
        self.visible = True
        if self._row is None:
            return
        if self.label is not None:
            self.label.grid(row=self._row, column=0, sticky="w", padx=(10, 8), pady=3)
        self.input.grid(row=self._row, column=1, sticky="ew", padx=(0, 10), pady=3)
        self._show_error()

    def hide(self) -> None:
        """Hidden fields do not apply: their input's text does not stop a start."""
        self.visible = False
        for widget in (self.label, self.input):
            if widget is not None:
                widget.grid_remove()
        self.model.report_input(self, self.path, None)

    def destroy(self) -> None:
        self.model.report_input(self, self.path, None)
        for widget in (self.label, self.input):
            if widget is not None:
                widget.destroy()

    # -- values ------------------------------------------------------------------------------------------------

    def refresh(self) -> None:
        """Show the config's current value (after a preset or config file was loaded); clears input errors."""
        self._loading = True
        try:
            self._load(self.model.get(self.path))
        finally:
            self._loading = False
        self.input_error = None
        self._show_error()

    def watches(self, path: str) -> bool:
        """Whether a change at `path` (a field, or a node holding it) may change what this view shows."""
        return self.path == path or self.path.startswith(path + ".")

    def sync(self) -> None:
        """Show the config's value after it changed elsewhere (another window, "load defaults").

        An input already showing that value is left alone, so the view being typed in keeps its text and cursor.
        """
        if not self.shows(self.model.get(self.path)):
            self.refresh()

    def shows(self, value: Any) -> bool:
        """Whether the input shows `value` (views that cannot tell say no and are simply reloaded)."""
        return False

    def write(self, value: Any) -> bool:
        """Write a (JSON-ish) value into the config when it is valid for this field; else mark the input."""
        if self._loading:
            return False
        problems = [p for p in check_value(self.info.spec, self.path, _from_json(self.info, value)) if p.is_error]
        if not problems:
            problems = [p for p in self.model.set(self.path, value) if p.is_error]
        self.input_error = problems[0].message if problems else None
        if not problems:
            self.config_problem = None
        self._show_error()
        return not problems

    def set_config_problem(self, message: str | None) -> None:
        if message != self.config_problem:
            self.config_problem = message
            self._show_error()

    @property
    def error(self) -> str | None:
        return self.input_error or self.config_problem

    def tooltip_text(self) -> str:
        meta = self.info.meta
        text = meta.help
        if self.label is None and meta.label:
            text = f"{meta.label}: {text}"
        if self.info.spec.type.nullable and self.info.spec.type.kind in ("int", "float"):
            text += "\n(Leave empty for the default.)"
        if self.error:
            text = f"⚠ {self.error}\n\n{text}"
        return text

    def _show_error(self) -> None:
        self._mark(self.error is not None)
        self.model.report_input(self, self.path, self.input_error if self.visible else None)


def _from_json(info: FieldInfo, value: Any) -> Any:
    """The typed value a JSON-ish widget value stands for (enum names → members), for checking before writing."""
    ftype = info.spec.type
    if ftype.kind == "enum" and isinstance(value, str) and ftype.cls is not None:
        return ftype.cls[value]
    return value


class BoolView(FieldView):
    def _build(self, frame: ctk.CTkFrame) -> None:
        self.switch = ctk.CTkSwitch(frame, text="", width=44, command=self._toggled)
        self.switch.grid(row=0, column=0, sticky="w")

    def _load(self, value: Any) -> None:
        if value:
            self.switch.select()
        else:
            self.switch.deselect()

    def _toggled(self) -> None:
        self.write(bool(self.switch.get()))


class ChoiceView(FieldView):
    """An option menu offering only the field's choices; a loaded value outside them is shown and marked."""

    def _build(self, frame: ctk.CTkFrame) -> None:
        self.options = choice_options(self.info.spec)
        self.labels = [choice_label(o) for o in self.options]
        self.menu = ctk.CTkOptionMenu(frame, values=self.labels, command=self._chosen, width=NUMBER_WIDTH + 60)
        self.menu.grid(row=0, column=0, sticky="w")
        self._normal_text = self.menu.cget("text_color")

    def _load(self, value: Any) -> None:
        self.menu.set(choice_label(value))

    def _chosen(self, label: str) -> None:
        value = self.options[self.labels.index(label)]
        self.write(to_json(value))

    def _mark(self, bad: bool) -> None:
        self.menu.configure(text_color=ERROR_COLOR if bad else self._normal_text)


class EntryView(FieldView):
    """A text or number entry, with a browse button for paths and a unit menu beside an interval."""

    def _build(self, frame: ctk.CTkFrame) -> None:
        kind = self.info.spec.type.kind
        self.is_number = kind in ("int", "float")
        self.var = tkinter.StringVar(frame)
        width = NUMBER_WIDTH if self.is_number else 200
        self.entry = ctk.CTkEntry(frame, textvariable=self.var, width=width)
        self._normal_border = self.entry.cget("border_color")
        column = 0
        self.entry.grid(row=0, column=column, sticky="w" if self.is_number else "ew")
        if not self.is_number:
            frame.grid_columnconfigure(0, weight=1)
        self.browse_button: ctk.CTkButton | None = None
        self.browse_menu: tkinter.Menu | None = None
        if self.info.meta.widget in PATH_WIDGETS:
            column += 1
            self.browse_button = ctk.CTkButton(frame, text="…", width=BROWSE_WIDTH, command=self.browse)
            self.browse_button.grid(row=0, column=column, padx=(4, 0))
        self.unit_view: ChoiceView | None = None
        if self.info.unit is not None:
            column += 1
            # The unit is a field of its own (its own path, choices and validation), shown without a label.
            unit_info = FieldInfo(self.info.unit, None, self.info.order)
            self.unit_view = ChoiceView(frame, unit_info, self.model, self.dialogs, with_label=False)
            self.unit_view.menu.configure(width=UNIT_WIDTH)
            self.unit_view.input.grid(row=0, column=column, padx=(6, 0), sticky="w")
        self.var.trace_add("write", self._typed)

    def _tooltip_targets(self) -> list[Any]:
        return [w for w in (self.entry, self.browse_button) if w is not None]

    def watches(self, path: str) -> bool:
        return super().watches(path) or (self.unit_view is not None and self.unit_view.watches(path))

    def sync(self) -> None:
        super().sync()
        if self.unit_view is not None:
            self.unit_view.sync()

    def shows(self, value: Any) -> bool:
        text = self.var.get()
        if not self.is_number:
            return text == display_text(value)
        ok, parsed, _ = parse_number(text, self.info.spec.type)
        return ok and parsed == value

    def _load(self, value: Any) -> None:
        self.var.set(display_text(value))
        if self.unit_view is not None:
            self.unit_view.refresh()

    def _typed(self, *_args: Any) -> None:
        if self._loading:
            return
        text = self.var.get()
        if not self.is_number:
            self.write(text)
            return
        ok, value, message = parse_number(text, self.info.spec.type)
        if ok:
            self.write(value)
        else:
            self.input_error = message
            self._show_error()

    def set_text(self, text: str) -> None:
        """Replace the entry's text as typing would (tests, and the browse button)."""
        self.entry.delete(0, "end")
        self.entry.insert(0, text)

    def _mark(self, bad: bool) -> None:
        self.entry.configure(border_color=ERROR_COLOR if bad else self._normal_border)

    def browse(self) -> None:
        if self.dialogs is None:
            return
        dialogs = self.dialogs
        kind = self.info.meta.widget
        title = self.info.meta.label or self.info.spec.name
        current = self.var.get()  # the dialogs open where the value points
        if kind == "dir":
            self._chosen_path(dialogs.open_dir(title, initial=current))
            return
        if kind == "file":
            self._chosen_path(dialogs.open_file(title, initial=current))
            return
        # Models and output paths may be a file or a folder: a small menu at the button asks which.
        assert self.browse_button is not None
        menu = tkinter.Menu(self.browse_button, tearoff=False)
        if kind == "model":
            menu.add_command(
                label="Model file…",
                command=lambda: self._chosen_path(dialogs.open_file(title, MODEL_FILES, initial=current)),
            )
        else:
            menu.add_command(
                label="File…",
                command=lambda: self._chosen_path(dialogs.save_file(title, ".safetensors", initial=current)),
            )
        menu.add_command(label="Folder…", command=lambda: self._chosen_path(dialogs.open_dir(title, initial=current)))
        self.browse_menu = menu
        x = self.browse_button.winfo_rootx()
        y = self.browse_button.winfo_rooty() + self.browse_button.winfo_height()
        try:
            menu.tk_popup(x, y)
        finally:
            menu.grab_release()

    def _chosen_path(self, path: str) -> None:
        if path:
            self.set_text(path)


class PathListView(EntryView):
    """A list of file paths (`list[str]` with `widget="files"`, e.g. an edit model's reference images) as one entry,
    the paths separated by `PATH_SEPARATOR`; the browse button adds a file to the end."""

    def shows(self, value: Any) -> bool:
        return self.var.get() == join_paths(value)

    def _load(self, value: Any) -> None:
        self.var.set(join_paths(value))

    def _typed(self, *_args: Any) -> None:
        if not self._loading:
            self.write(split_paths(self.var.get()))

    def browse(self) -> None:
        if self.dialogs is None:
            return
        chosen = self.dialogs.open_file(self.info.meta.label or self.info.spec.name)
        if chosen:
            self.set_text(join_paths([*split_paths(self.var.get()), chosen]))


class JsonObjectView(EntryView):
    """A `dict` setting (e.g. Muon's auxiliary Adam settings) as one entry holding a JSON object; empty: None (the
    defaults). Text that is not a JSON object is marked and not written."""

    def shows(self, value: Any) -> bool:
        try:
            return _json_object(self.var.get()) == (value or None)
        except ValueError:
            return False

    def _load(self, value: Any) -> None:
        self.var.set(json.dumps(value) if value else "")

    def _typed(self, *_args: Any) -> None:
        if self._loading:
            return
        try:
            value = _json_object(self.var.get())
        except ValueError as e:
            self.input_error = str(e)
            self._show_error()
            return
        self.write(value)


def _json_object(text: str) -> dict | None:
    if not text.strip():
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"not JSON: {e.msg} (at character {e.pos + 1})") from None
    if not isinstance(value, dict):
        raise ValueError('not a JSON object: write {"key": value, ...}')
    return value


PATH_SEPARATOR = "; "


def join_paths(paths: Any) -> str:
    return PATH_SEPARATOR.join(str(p) for p in paths or [])


def split_paths(text: str) -> list[str]:
    return [part.strip() for part in text.split(PATH_SEPARATOR.strip()) if part.strip()]


def sync_views(views: Iterable[FieldView], path: str | None) -> None:
    """Bring the views showing `path` (or anything under it) up to date after the config changed there."""
    if path is None:
        return
    for view in views:
        if view.watches(path):
            view.sync()


def make_view(
    parent: Any, info: FieldInfo, model: ConfigModel, dialogs: Dialogs | None, with_label: bool = True
) -> FieldView | None:
    """The view for a field, chosen by type and metadata; None for kinds a form has no widget for."""
    kind = info.spec.type.kind
    if kind == "bool":
        return BoolView(parent, info, model, dialogs, with_label)
    if kind == "enum" or info.meta.choices is not None:
        return ChoiceView(parent, info, model, dialogs, with_label)
    if kind in ("int", "float", "str"):
        return EntryView(parent, info, model, dialogs, with_label)
    if kind == "list" and info.meta.widget == "files":
        return PathListView(parent, info, model, dialogs, with_label)
    return None
