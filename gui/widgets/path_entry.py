"""A text field for a file or folder with browse buttons beside it, for the tool windows (the forms of the main
window have their own, generated from field metadata)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import customtkinter as ctk

if TYPE_CHECKING:
    from gui.dialogs import Dialogs

# What each kind of button asks for, and its text.
BROWSE_TEXT = {"file": "File…", "folder": "Folder…", "save": "Save as…"}


class PathEntry(ctk.CTkFrame):
    """An entry (`entry`) and one button per kind in `kinds` ("file", "folder", "save"); a chosen path replaces the
    entry's text. `choose` may decide a "save" button's kind when it is pressed (a folder for a folder format)."""

    def __init__(
        self,
        master: Any,
        dialogs: Dialogs | None,
        title: str,
        kinds: Sequence[str] = ("file",),
        filetypes: Sequence[tuple[str, str]] = (),
        default_ext: str = "",
        width: int = 320,
        save_kind: Callable[[], str] | None = None,
    ) -> None:
        super().__init__(master, fg_color="transparent")
        self.dialogs = dialogs
        self.title = title
        self.filetypes = filetypes
        self.default_ext = default_ext
        self.save_kind = save_kind
        self.grid_columnconfigure(0, weight=1)
        self.entry = ctk.CTkEntry(self, width=width)
        self.entry.grid(row=0, column=0, sticky="ew")
        self.buttons: dict[str, ctk.CTkButton] = {}
        for column, kind in enumerate(kinds, start=1):
            button = ctk.CTkButton(self, text=BROWSE_TEXT[kind], width=78, command=lambda k=kind: self.browse(k))
            button.grid(row=0, column=column, padx=(4, 0))
            self.buttons[kind] = button

    def browse(self, kind: str) -> str:
        """Ask for a path of `kind` near the current value; the chosen one fills the entry ("" when cancelled)."""
        if self.dialogs is None:
            return ""
        current = self.entry.get().strip()
        if kind == "save" and self.save_kind is not None:
            kind = self.save_kind()
        if kind == "folder":
            chosen = self.dialogs.open_dir(self.title, initial=current)
        elif kind == "save":
            chosen = self.dialogs.save_file(self.title, self.default_ext, self.filetypes, initial=current)
        else:
            chosen = self.dialogs.open_file(self.title, self.filetypes, initial=current)
        if chosen:
            self.entry.delete(0, "end")
            self.entry.insert(0, chosen)
        return chosen


def in_window_terms(text: str, names: Mapping[str, str], phrases: Mapping[str, str] | None = None) -> str:
    """A library message written for the command line in the window's words: each `phrases` key is replaced first
    ("pass the file with --model-path"), then each command-line option the window has a field for (`--model-path`)
    by that field's name."""
    for phrase, words in (phrases or {}).items():
        text = text.replace(phrase, words)
    return re.sub(r"--[a-z][a-z0-9-]*", lambda m: names.get(m.group(0), m.group(0)), text)
