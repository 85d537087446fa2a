"""Slow work (a histogram, the preflight report) on a worker thread, with the result handed back on the Tk thread.

The worker never touches a widget: `run_in_background` polls it with `after()` and calls `on_done` from the Tk loop.
"""

from __future__ import annotations

import threading
import tkinter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

POLL_MS = 40


@dataclass
class BackgroundResult:
    value: Any = None
    error: BaseException | None = None


class BackgroundJob:
    def __init__(self, widget: Any, work: Callable[[], Any], on_done: Callable[[BackgroundResult], None]) -> None:
        self.widget = widget
        self.on_done = on_done
        self.result = BackgroundResult()
        self.cancelled = False
        # A worker's garbage collection hands destroyed widgets' Tcl objects to the Tk thread (tk_finalizers): no full
        # collection on the Tk thread here, which held every job's start (an estimate per edit) 0.1-0.6 s.
        self._thread = threading.Thread(target=self._run, args=(work,), name="onetrainer-gui-job", daemon=True)
        self._thread.start()
        # Never `on_done` from here: the caller has not even got the job back yet.
        widget.after(POLL_MS, self._poll)

    def _run(self, work: Callable[[], Any]) -> None:
        try:
            self.result.value = work()
        except BaseException as e:  # handed to the Tk thread, which shows it
            self.result.error = e

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()

    def cancel(self) -> None:
        """Forget the result (the worker finishes on its own; it holds no widget)."""
        self.cancelled = True

    def _poll(self) -> None:
        if self.cancelled:
            return
        if not self.done:
            try:
                self.widget.after(POLL_MS, self._poll)
            except tkinter.TclError:  # the widget is gone
                self.cancelled = True
            return
        try:
            exists = bool(self.widget.winfo_exists())
        except tkinter.TclError:
            exists = False
        if exists:
            self.on_done(self.result)


def run_in_background(
    widget: Any, work: Callable[[], Any], on_done: Callable[[BackgroundResult], None]
) -> BackgroundJob:
    """Run `work()` on a thread; `on_done(result)` runs on the Tk thread when it ends (not when `widget` is gone)."""
    return BackgroundJob(widget, work, on_done)
