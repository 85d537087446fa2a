"""A generated form: the fields of one tab that apply now, in titled groups laid out in balanced columns.

Views are created the first time their field applies and then only shown or hidden, so switching the model type
or training method is cheap and keeps what was typed. No family or method is named here: `FieldInfo.applies`
(the config's metadata) decides.

A deferred form lays out its groups at once and creates its views a few at a time (`build_some`), so that the app can
build its tabs in the Tk loop's spare time without holding input back for a whole tab (a tab of 60 fields is about
half a second of the Tk thread, several seconds on a busy machine); anything that asks for its views finishes them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import customtkinter as ctk

from gui.forms.fields import LABEL_WIDTH, FieldView, make_view, sync_views
from gui.forms.selection import FieldInfo, arrange_groups, form_fields, split_columns
from gui.widgets.binding import bind_self
from gui.widgets.tooltip import add_tooltip

if TYPE_CHECKING:
    from gui.dialogs import Dialogs
    from gui.model import ConfigModel


class Group:
    """A titled frame holding the rows of one group."""

    def __init__(self, parent: Any, title: str) -> None:
        self.title = title
        self.frame = ctk.CTkFrame(parent)
        self.frame.grid_columnconfigure(0, minsize=LABEL_WIDTH + 18)
        self.frame.grid_columnconfigure(1, weight=1)
        heading = ctk.CTkLabel(self.frame, text=title, font=ctk.CTkFont(size=14, weight="bold"), anchor="w")
        # The title takes row 0; field views use rows from 1 on.
        heading.grid(row=0, column=0, columnspan=2, sticky="w", padx=10, pady=(6, 2))
        self.visible_rows = 0


class Form:
    def __init__(
        self,
        parent: Any,
        model: ConfigModel,
        dialogs: Dialogs | None,
        tab: str,
        columns: int = 3,
        default_group: str | None = None,
        fields: list[FieldInfo] | None = None,
        deferred: bool = False,
    ) -> None:
        self.model = model
        self.dialogs = dialogs
        self.tab = tab
        self.default_group = default_group or tab.replace("_", " ").capitalize()
        self.frame = ctk.CTkFrame(parent, fg_color="transparent")
        # A tab's form shows the fields declared for that tab; windows pass their own (a concept's, a sample's).
        self.fields = fields if fields is not None else form_fields(model.config, tab)
        self._rows = {info.path: i + 1 for i, info in enumerate(self.fields)}
        self._views: dict[str, FieldView] = {}
        self._deferred = deferred
        self._queued: list[tuple[FieldInfo, Group]] = []  # views to create (deferred), in layout order
        self.groups: dict[str, Group] = {}
        self._buttons: dict[str, list[tuple[str, Callable[[], None], str]]] = {}
        self.buttons: dict[str, ctk.CTkButton] = {}
        # The same field may be shown twice (the timestep window and the training tab): follow edits made elsewhere.
        self._unsubscribe: Callable[[], None] | None = model.subscribe(self._config_changed)
        # Validation's marks reach every form, a window's too (the sample editor marks what the samples row marks).
        self._unsubscribe_marks = model.subscribe_marks(self.mark)
        bind_self(self.frame, "<Destroy>", self._destroyed)
        self.columns: list[ctk.CTkFrame] = []
        for c in range(columns):
            self.frame.grid_columnconfigure(c, weight=1, uniform="form-column")
            column = ctk.CTkFrame(self.frame, fg_color="transparent", width=0, height=0)  # empty: no 200 px default
            column.grid(row=0, column=c, sticky="new", padx=4)
            self.columns.append(column)
        self.update()

    def visible_fields(self) -> list[FieldInfo]:
        ctx = self.model.context()
        return [info for info in self.fields if info.applies(ctx)]

    @property
    def views(self) -> dict[str, FieldView]:
        """The views by path (every view that applies now is created first)."""
        self.finish()
        return self._views

    @property
    def complete(self) -> bool:
        """Whether every field that applies has its view (a deferred form's are created by `build_some`)."""
        return not self._queued

    def build_some(self, count: int) -> bool:
        """Create and show up to `count` of the views still to create; True when none is left."""
        while self._queued and count > 0:
            info, group = self._queued.pop(0)
            self._show(info, group)
            count -= 1
        return not self._queued

    def finish(self) -> None:
        self.build_some(len(self._queued))

    def update(self) -> None:
        """Show the fields that apply to the config's current context, hide the rest, and lay the groups out."""
        visible = self.visible_fields()
        shown = {info.path for info in visible}
        for path, view in self._views.items():
            if path not in shown and view.visible:
                view.hide()
        arranged = arrange_groups(visible, self.default_group)
        self._queued = []
        for title, members in arranged:
            group = self._group(title)
            for info in members:
                if self._deferred and info.path not in self._views:
                    self._queued.append((info, group))
                else:
                    self._show(info, group)
            group.visible_rows = len(members)
        self._layout([self.groups[title] for title, _ in arranged])

    def _show(self, info: FieldInfo, group: Group) -> None:
        view = self._view(info, group)
        if view is not None and not view.visible:
            view.place(self._rows[info.path])

    def refresh(self) -> None:
        """Pull every shown value from the config (after it was replaced or edited elsewhere)."""
        for view in self._views.values():  # views created later read the config then
            view.refresh()

    def mark(self, problems: dict[str, str]) -> None:
        """Show validation's message (by path) on each field; fields not named are cleared."""
        for path, view in self._views.items():
            view.set_config_problem(problems.get(path))
            unit = getattr(view, "unit_view", None)
            if unit is not None:
                unit.set_config_problem(problems.get(unit.path))

    def attach_button(self, path: str, text: str, command: Callable[[], None], tooltip: str = "") -> None:
        """A button beside a field's input ("…" opening a dialog); added when the field's view exists."""
        self._buttons.setdefault(path, []).append((text, command, tooltip))
        view = self._views.get(path)
        if view is not None:
            self._add_buttons(view)

    def _add_buttons(self, view: FieldView) -> None:
        for text, command, tooltip in self._buttons.get(view.path, []):
            key = f"{view.path}:{text}"
            if key in self.buttons:
                continue
            button = ctk.CTkButton(view.input, text=text, width=30, command=command)
            button.grid(row=0, column=view.input.grid_size()[0], padx=(4, 0))
            if tooltip:
                add_tooltip(button, tooltip)
            self.buttons[key] = button

    def button(self, path: str, text: str = "…") -> ctk.CTkButton:
        return self.buttons[f"{path}:{text}"]

    def _config_changed(self, path: str | None) -> None:
        if self._unsubscribe is not None:  # a listener may still be called in the round that destroyed the form
            sync_views(self._views.values(), path)

    def _destroyed(self, event: Any) -> None:
        if event.widget is self.frame and self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
            self._unsubscribe_marks()
            for view in self._views.values():  # a closed window's inputs no longer hold anything back
                self.model.report_input(view, view.path, None)
                unit = getattr(view, "unit_view", None)
                if unit is not None:
                    self.model.report_input(unit, unit.path, None)

    def view(self, path: str) -> FieldView | None:
        return self.views.get(path)

    def shown_paths(self) -> list[str]:
        return [path for path, view in self.views.items() if view.visible]

    # -- internals ---------------------------------------------------------------------------------------------

    def _group(self, title: str) -> Group:
        group = self.groups.get(title)
        if group is None:
            group = Group(self.frame, title)
            self.groups[title] = group
        return group

    def _view(self, info: FieldInfo, group: Group) -> FieldView | None:
        view = self._views.get(info.path)
        if view is None:
            view = make_view(group.frame, info, self.model, self.dialogs)
            if view is None:
                return None
            self._views[info.path] = view
            self._add_buttons(view)
            view.set_config_problem(self.model.marks.get(info.path))
        return view

    def _layout(self, groups: list[Group]) -> None:
        for group in self.groups.values():
            group.frame.pack_forget()
        # A group's height is about its rows plus its title.
        sizes = [group.visible_rows + 1 for group in groups]
        for column, indexes in zip(self.columns, split_columns(sizes, len(self.columns))):
            for i in indexes:
                groups[i].frame.pack(in_=column, fill="x", pady=(0, 8))
