"""Tk objects (fonts, images, variables) finalised on the Tk thread, whichever thread collects them.

Python's cyclic garbage collector runs in the thread that happens to allocate when a threshold is crossed: often a
worker (the estimate's measurement, a run's trainer thread). A tkinter `Font`, `Image` or `Variable` collected there
calls into Tcl from that thread, and tkinter makes such a call wait for the main loop: up to a second per object, and
in vain where the window is driven by `update()` (as the GUI tests drive it) rather than `mainloop()`. A closed window
leaves hundreds of these (customtkinter gives every widget its own font), so a worker could stall for minutes while
holding the model library. Here their finalisers hand the Tcl call to the Tk thread instead, which makes it on its
next `drain()` (the app drains from its poll loop and when a window closes).
"""

from __future__ import annotations

import contextlib
import queue
import threading
import tkinter
import tkinter.font
from collections.abc import Callable
from typing import Any

_deferred: queue.SimpleQueue[tuple[Callable[[Any], None], Any]] = queue.SimpleQueue()
_installed = False


def _on_tk_thread(original: Callable[[Any], None]) -> Callable[[Any], None]:
    def finalize(obj: Any) -> None:
        if threading.current_thread() is threading.main_thread():
            original(obj)
        else:  # keeps `obj` alive until the Tk thread has made the call
            _deferred.put((original, obj))

    finalize.__wrapped__ = original  # type: ignore[attr-defined]
    return finalize


def install() -> None:
    """Route the finalisers of Tk fonts, images and variables through the Tk thread (idempotent)."""
    global _installed
    if _installed:
        return
    for cls in (tkinter.font.Font, tkinter.Image, tkinter.Variable):
        cls.__del__ = _on_tk_thread(cls.__del__)  # type: ignore[method-assign]
    _installed = True


def drain() -> int:
    """Make the Tcl calls of the objects other threads collected (on the Tk thread); returns how many."""
    count = 0
    while True:
        try:
            original, obj = _deferred.get_nowait()
        except queue.Empty:
            return count
        with contextlib.suppress(tkinter.TclError, RuntimeError):  # its interpreter is gone: nothing left to free
            original(obj)
        count += 1


def pending() -> int:
    return _deferred.qsize()
