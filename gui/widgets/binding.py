"""Binding events on a customtkinter widget's own Tk widget."""

from __future__ import annotations

import tkinter
from collections.abc import Callable
from typing import Any


def bind_self(widget: Any, sequence: str, callback: Callable[[Any], object]) -> None:
    """Bind on the widget itself, keeping other bindings (a CTkFrame's `bind` binds its inner canvas instead)."""
    tkinter.Misc.bind(widget, sequence, callback, "+")
