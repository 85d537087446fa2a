"""Where the app's windows open: over the main window, centred, rather than wherever the window manager puts a new
window (often the screen's top-left corner, far from what the user is looking at)."""

from __future__ import annotations

from typing import Any

import customtkinter as ctk


def place_over(window: Any, master: Any, size: tuple[int, int] | None = None) -> None:
    """Open `window` centred over the main window of `master` (any widget in it). `size` (width, height), in the
    unscaled pixels customtkinter's `geometry` takes, is set with it; without one, call this once the window's widgets
    are built: their requested size is used. A window larger than the main window opens at its top-left corner, so its
    title bar is never above the main window's."""
    owner = master.winfo_toplevel()
    if size is not None:
        window.geometry(f"{size[0]}x{size[1]}")
        scaling = ctk.ScalingTracker.get_window_scaling(window)
        width, height = round(size[0] * scaling), round(size[1] * scaling)
    else:
        window.update_idletasks()
        width, height = window.winfo_reqwidth(), window.winfo_reqheight()
    x = owner.winfo_rootx() + max(0, (owner.winfo_width() - width) // 2)
    y = owner.winfo_rooty() + max(0, (owner.winfo_height() - height) // 2)
    window.wm_geometry(f"+{x}+{y}")  # a position only (Tk's own call: customtkinter scales sizes, not positions)
