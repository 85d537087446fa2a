"""A tooltip: a small window beside the pointer after it rests on a widget; its text may change (error messages)."""

from __future__ import annotations

import contextlib
import tkinter
from collections.abc import Callable
from typing import Any

DELAY_MS = 450
WRAP_PX = 420
BACKGROUND = "#1f1f1f"
FOREGROUND = "#eeeeee"


class Tooltip:
    def __init__(self, widget: Any, text: str | Callable[[], str], delay_ms: int = DELAY_MS) -> None:
        self.widget = widget
        self._text = text
        self._delay_ms = delay_ms
        self._after_id: str | None = None
        self.window: tkinter.Toplevel | None = None
        # add="+": customtkinter widgets keep their own hover bindings.
        widget.bind("<Enter>", self._schedule, add="+")
        widget.bind("<Leave>", self.hide, add="+")
        widget.bind("<ButtonPress>", self.hide, add="+")

    @property
    def text(self) -> str:
        return self._text() if callable(self._text) else self._text

    @text.setter
    def text(self, value: str | Callable[[], str]) -> None:
        self._text = value

    def _schedule(self, _event: Any = None) -> None:
        self._cancel()
        try:
            self._after_id = self.widget.after(self._delay_ms, self.show)
        except tkinter.TclError:  # the widget is being destroyed
            self._after_id = None

    def _cancel(self) -> None:
        if self._after_id is not None:
            with contextlib.suppress(tkinter.TclError):
                self.widget.after_cancel(self._after_id)
            self._after_id = None

    def show(self) -> None:
        self._after_id = None
        self.hide()
        text = self.text
        try:
            if not text or not self.widget.winfo_exists():
                return
            x = self.widget.winfo_pointerx() + 16
            y = self.widget.winfo_pointery() + 14
            window = tkinter.Toplevel(self.widget)
        except tkinter.TclError:
            return
        window.wm_overrideredirect(True)
        label = tkinter.Label(
            window,
            text=text,
            justify="left",
            background=BACKGROUND,
            foreground=FOREGROUND,
            wraplength=WRAP_PX,
            padx=8,
            pady=6,
            relief="solid",
            borderwidth=1,
        )
        label.pack()
        window.wm_geometry(f"+{x}+{y}")
        self.window = window

    def hide(self, _event: Any = None) -> None:
        self._cancel()
        if self.window is not None:
            with contextlib.suppress(tkinter.TclError):
                self.window.destroy()
            self.window = None


def add_tooltip(widgets: Any, text: str | Callable[[], str]) -> list[Tooltip]:
    """One tooltip on each of `widgets` (a widget or an iterable of them), all showing the same text."""
    if not isinstance(widgets, list | tuple):
        widgets = [widgets]
    return [Tooltip(w, text) for w in widgets]
