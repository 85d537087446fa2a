"""Keyboard habits users bring from other programs, bound once for every entry and text box of the app."""

from __future__ import annotations

import tkinter
from typing import Any


def _select_all_entry(event: Any) -> str:
    widget = event.widget
    widget.selection_range(0, "end")
    widget.icursor("end")
    return "break"  # not also Tk's own Ctrl+A (the start of the line on X11)


def _select_all_text(event: Any) -> str:
    widget = event.widget
    widget.tag_add("sel", "1.0", "end-1c")
    widget.mark_set("insert", "end-1c")
    return "break"


def bind_select_all(root: tkinter.Misc) -> None:
    """Ctrl+A selects all the text of an entry or a text box (Tk's X11 default moves to the start of the line)."""
    for sequence in ("<Control-a>", "<Control-A>"):
        root.bind_class("Entry", sequence, _select_all_entry)
        root.bind_class("Text", sequence, _select_all_text)
