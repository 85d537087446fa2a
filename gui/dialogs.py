"""Every question and message the app puts to the user, in one object.

Keeping them together lets tests swap the blocking ones (file pickers, yes/no) for scripted answers while the
message windows stay real. Messages open non-modal windows and are also kept in `history`.
"""

from __future__ import annotations

import contextlib
import re
import tkinter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from tkinter import filedialog
from typing import Any

import customtkinter as ctk

from gui.window_position import place_over

JSON_FILES = (("JSON", "*.json"), ("All files", "*"))
MODEL_FILES = (("Models", "*.safetensors *.ckpt *.pt *.pth *.bin"), ("All files", "*"))


@dataclass(frozen=True)
class Message:
    title: str
    text: str
    error: bool


class TextWindow(ctk.CTkToplevel):
    """A message that may be long (a list of problems, a traceback): scrollable, selectable, with Copy."""

    def __init__(self, master: Any, title: str, text: str, error: bool = False) -> None:
        super().__init__(master)
        self.title(title)
        place_over(self, master, (720, 420))
        self.minsize(420, 240)
        self.grid_columnconfigure(0, weight=1)
        self.grid_rowconfigure(1, weight=1)
        heading = ctk.CTkLabel(
            self,
            text=title,
            font=ctk.CTkFont(size=15, weight="bold"),
            text_color=("#b03a2e", "#ff7b72") if error else None,
            anchor="w",
        )
        heading.grid(row=0, column=0, sticky="ew", padx=12, pady=(10, 4))
        self.textbox = ctk.CTkTextbox(self, wrap="word")
        self.textbox.insert("1.0", text)
        self.textbox.configure(state="disabled")
        self.textbox.grid(row=1, column=0, sticky="nsew", padx=12)
        buttons = ctk.CTkFrame(self, fg_color="transparent")
        buttons.grid(row=2, column=0, sticky="e", padx=12, pady=10)
        ctk.CTkButton(buttons, text="Copy", width=90, command=lambda: self._copy(text)).pack(side="left", padx=4)
        ctk.CTkButton(buttons, text="Close", width=90, command=self.destroy).pack(side="left", padx=4)
        self.text = text

    def _copy(self, text: str) -> None:
        self.clipboard_clear()
        self.clipboard_append(text)


class ConfirmDialog(ctk.CTkToplevel):
    """A question with a row of buttons, drawn by customtkinter so it follows the app's appearance (Tk's own message
    boxes are light whatever the app's theme), opened over the main window. Modal while open; `answer` is the value of
    the button pressed, or `cancel` when the window is closed or Escape is pressed. With `entry`, a line to type in
    above the buttons (`typed` holds what was typed; Return presses the first button)."""

    def __init__(
        self,
        master: Any,
        title: str,
        text: str,
        buttons: Sequence[tuple[str, Any]],
        cancel: Any,
        entry: bool = False,
    ) -> None:
        super().__init__(master)
        self.title(title)
        self.resizable(False, False)
        self.answer = cancel
        self.typed = ""
        self.grid_columnconfigure(0, weight=1)
        ctk.CTkLabel(self, text=text, justify="left", anchor="w", wraplength=440).grid(
            row=0, column=0, sticky="ew", padx=16, pady=(16, 10)
        )
        self.entry: ctk.CTkEntry | None = None
        if entry:
            self.entry = ctk.CTkEntry(self, width=440)
            self.entry.grid(row=1, column=0, sticky="ew", padx=16, pady=(0, 10))
        row = ctk.CTkFrame(self, fg_color="transparent")
        row.grid(row=2, column=0, sticky="e", padx=12, pady=(0, 12))
        self.buttons: dict[str, ctk.CTkButton] = {}
        for label, value in buttons:
            button = ctk.CTkButton(row, text=label, width=100, command=lambda v=value: self._choose(v))
            button.pack(side="left", padx=4)
            self.buttons[label] = button
        self.protocol("WM_DELETE_WINDOW", lambda: self._choose(cancel))
        self.bind("<Escape>", lambda _e: self._choose(cancel))
        first = next(iter(self.buttons.values()), None)
        if first is not None:
            self.bind("<Return>", lambda _e: first.invoke())
        self.transient(master)
        place_over(self, master)

    def _choose(self, value: Any) -> None:
        self.answer = value
        if self.entry is not None:
            self.typed = self.entry.get()
        self.destroy()

    def ask(self) -> Any:
        """Wait (the window stays painted) until a button is pressed; its value."""
        self.update_idletasks()
        with contextlib.suppress(tkinter.TclError):  # not viewable yet on some window managers: modal anyway soon
            self.wait_visibility()
            self.grab_set()
        (self.entry or self).focus_force()
        self.wait_window()
        return self.answer


def start_dir(current: str = "") -> str:
    """Where a file dialog opens: the folder of the field's current value (or its nearest existing parent; relative
    values are relative to the folder the app runs in), else the home folder. A model name (`tiny:sd15`, a hub id)
    is no folder: home."""
    text = current.strip()
    if text and not re.match(r"[A-Za-z][A-Za-z0-9+.-]+:", text):
        path = Path(text).expanduser()
        if not path.is_absolute():
            path = Path.cwd() / path
        for candidate in (path, *path.parents):
            if candidate.is_dir():
                if candidate.parent == candidate:  # the file system's root says nothing about the value
                    break
                return str(candidate)
    return str(Path.home())


def hide_hidden_files(root: Any) -> None:
    """Tk's own file dialog (Linux) lists hidden files and folders (.git, .venv, .cache) unless told not to; it keeps
    a "Show hidden" switch for whoever wants them."""
    if root.tk.call("tk", "windowingsystem") != "x11":
        return
    try:
        root.tk.call("catch", "tk_getOpenFile -no-such-option")  # loads the dialog's code without opening it
        root.tk.call("set", "::tk::dialog::file::showHiddenBtn", "1")
        root.tk.call("set", "::tk::dialog::file::showHiddenVar", "0")
    except tkinter.TclError:  # another Tk: its own dialogs
        pass


class Dialogs:
    def __init__(self, parent: Any) -> None:
        self.parent = parent
        self.history: list[Message] = []
        self.windows: list[TextWindow] = []
        hide_hidden_files(parent)

    # -- questions (blocking) ------------------------------------------------------------------------------------

    def open_file(self, title: str, filetypes: Sequence[tuple[str, str]] = (), initial: str = "") -> str:
        """A chosen file's path, or "" when cancelled; the dialog opens near `initial` (the field's value)."""
        return (
            filedialog.askopenfilename(
                parent=self.parent, title=title, filetypes=list(filetypes) or None, initialdir=start_dir(initial)
            )
            or ""
        )

    def open_dir(self, title: str, initial: str = "") -> str:
        return (
            filedialog.askdirectory(parent=self.parent, title=title, mustexist=False, initialdir=start_dir(initial))
            or ""
        )

    def save_file(
        self,
        title: str,
        default_ext: str = ".json",
        filetypes: Sequence[tuple[str, str]] = (),
        initial: str = "",
    ) -> str:
        return (
            filedialog.asksaveasfilename(
                parent=self.parent,
                title=title,
                defaultextension=default_ext,
                filetypes=list(filetypes) or None,
                initialdir=start_dir(initial),
            )
            or ""
        )

    def ask_yes_no(self, title: str, text: str) -> bool:
        return bool(self.ask_choice(title, text, [("Yes", True), ("No", False)], False))

    def ask_save_changes(self, title: str, text: str) -> str | None:
        """ "save", "discard", or None to cancel what was about to replace the changes."""
        return self.ask_choice(title, text, [("Save", "save"), ("Don't save", "discard"), ("Cancel", None)], None)

    def ask_choice(self, title: str, text: str, buttons: Sequence[tuple[str, Any]], cancel: Any) -> Any:
        """The value of the button pressed (`buttons`: label and value, the first one Return's), or `cancel` when the
        question is closed or Escape is pressed."""
        return ConfirmDialog(self.parent, title, text, buttons, cancel).ask()

    def ask_string(self, title: str, text: str) -> str:
        """A line of text the user types, or "" when cancelled."""
        dialog = ConfirmDialog(self.parent, title, text, [("OK", True), ("Cancel", False)], False, entry=True)
        return dialog.typed.strip() if dialog.ask() else ""

    # -- messages (non-blocking) ---------------------------------------------------------------------------------

    def show_text(self, title: str, text: str, error: bool = False) -> TextWindow | None:
        self.history.append(Message(title, text, error))
        try:
            window = TextWindow(self.parent, title, text, error)
        except tkinter.TclError:  # the main window is closing
            return None
        self.windows = [w for w in self.windows if w.winfo_exists()] + [window]
        return window

    def show_error(self, title: str, text: str) -> TextWindow | None:
        return self.show_text(title, text, error=True)
