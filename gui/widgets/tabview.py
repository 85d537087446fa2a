"""A tab view whose set of tabs can change (the LoRA tab comes and goes with the training method).

customtkinter's CTkTabview is awkward for that (insertion order bookkeeping); a segmented button over a stack of
frames is all that is needed. Pages are created on first use so that hidden tabs cost nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import customtkinter as ctk


class TabView(ctk.CTkFrame):
    def __init__(self, master: Any, command: Callable[[str], None] | None = None, **kwargs: Any) -> None:
        super().__init__(master, **kwargs)
        self._command = command
        self._keys: list[str] = []
        self._titles: dict[str, str] = {}
        self._pages: dict[str, ctk.CTkFrame] = {}
        self._current: str | None = None
        self.grid_columnconfigure(0, weight=1)
        self.grid_rowconfigure(1, weight=1)
        self.bar = ctk.CTkSegmentedButton(self, values=[], command=self._clicked)
        self.bar.grid(row=0, column=0, pady=(6, 4))
        self._body = ctk.CTkFrame(self, fg_color="transparent")
        self._body.grid(row=1, column=0, sticky="nsew")
        self._body.grid_columnconfigure(0, weight=1)
        self._body.grid_rowconfigure(0, weight=1)

    @property
    def keys(self) -> list[str]:
        return list(self._keys)

    @property
    def current(self) -> str | None:
        return self._current

    def set_tabs(self, tabs: Sequence[tuple[str, str]]) -> None:
        """Show these (key, title) tabs in this order; the current tab stays selected when it is still there."""
        keys = [k for k, _ in tabs]
        if keys == self._keys:
            return
        self._keys = keys
        self._titles = dict(tabs)
        self.bar.configure(values=[title for _, title in tabs])
        if self._current in keys:
            self.bar.set(self._titles[self._current])
        elif keys:
            self.select(keys[0])
        else:
            self._hide_current()

    def page(self, key: str) -> ctk.CTkFrame:
        """The frame holding the content of tab `key` (created on first use)."""
        page = self._pages.get(key)
        if page is None:
            page = ctk.CTkFrame(self._body, fg_color="transparent")
            page.grid_columnconfigure(0, weight=1)
            page.grid_rowconfigure(0, weight=1)
            self._pages[key] = page
        return page

    def select(self, key: str) -> None:
        if key not in self._keys:
            raise KeyError(f"no tab '{key}' (shown: {', '.join(self._keys)})")
        if key != self._current:
            self._hide_current()
            self._current = key
            self.page(key).grid(row=0, column=0, sticky="nsew")
        self.bar.set(self._titles[key])
        if self._command is not None:
            self._command(key)

    def _hide_current(self) -> None:
        if self._current is not None and self._current in self._pages:
            self._pages[self._current].grid_remove()
        self._current = None

    def _clicked(self, title: str) -> None:
        for key, t in self._titles.items():
            if t == title:
                self.select(key)
                return
