"""Slow work (a histogram, the preflight report) on a worker thread, with the result handed back on the Tk thread.

The worker never touches a widget: `run_in_background` polls it with `after()` and calls `on_done` from the Tk loop.

Workers are daemon threads, so a job never keeps a closed window's process alive; but a process that ends while one
of them is inside torch aborts ("terminate called without an active exception": torch's thread pool is torn down
under it). At exit the process therefore waits for the jobs still running (`wait_for_jobs`, a few seconds at most).
"""

from __future__ import annotations

import atexit
import threading
import time
import tkinter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

POLL_MS = 40
EXIT_WAIT_SECONDS = 20.0  # at exit, how long the running jobs are waited for (an estimate takes well under that)

_running: set[threading.Thread] = set()
_running_lock = threading.Lock()


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
        with _running_lock:
            _running.add(self._thread)
        self._thread.start()
        # Never `on_done` from here: the caller has not even got the job back yet.
        widget.after(POLL_MS, self._poll)

    def _run(self, work: Callable[[], Any]) -> None:
        try:
            self.result.value = work()
        except BaseException as e:  # handed to the Tk thread, which shows it
            self.result.error = e
        finally:
            with _running_lock:
                _running.discard(threading.current_thread())

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


def wait_for_jobs(timeout: float = EXIT_WAIT_SECONDS) -> bool:
    """Wait until no job runs, `timeout` seconds at most; whether none does."""
    deadline = time.monotonic() + timeout
    while True:
        with _running_lock:
            threads = list(_running)
        if not threads:
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        threads[0].join(left)


atexit.register(wait_for_jobs)
