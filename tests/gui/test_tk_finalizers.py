"""Tk fonts and variables collected by a worker thread's garbage collection are freed on the Tk thread: the worker
never calls Tcl (tkinter would make it wait up to a second per object for a main loop the tests never run)."""

from __future__ import annotations

import gc
import queue
import threading
import tkinter
import tkinter.font

import pytest

from gui import tk_finalizers

pytestmark = pytest.mark.gui


class _Cycle:
    """Widgets hold their fonts and variables in reference cycles: only the cyclic collector frees them."""

    def __init__(self, root: tkinter.Tk, size: int) -> None:
        self.font = tkinter.font.Font(root=root, family="Helvetica", size=size)
        self.variable = tkinter.StringVar(root, "text")
        self.me = self


class _CountingQueue:
    """The deferred calls' queue, counting what the finalizers hand over (another window's drain may run them)."""

    def __init__(self) -> None:
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.handed_over = 0

    def put(self, item) -> None:
        self.handed_over += 1
        self.queue.put(item)

    def get_nowait(self):
        return self.queue.get_nowait()

    def qsize(self) -> int:
        return self.queue.qsize()


def test_fonts_and_variables_collected_by_a_worker_are_freed_on_the_tk_thread(display, monkeypatch) -> None:
    tk_finalizers.install()
    deferred = _CountingQueue()
    monkeypatch.setattr(tk_finalizers, "_deferred", deferred)
    root = tkinter.Tk()
    enabled = gc.isenabled()
    gc.disable()  # only the worker's collection below frees them
    try:
        cycles = [_Cycle(root, 10 + i) for i in range(4)]
        fonts = {c.font.name for c in cycles}
        variables = {c.variable._name for c in cycles}
        del cycles
        worker = threading.Thread(target=gc.collect)
        worker.start()
        while worker.is_alive():
            root.update()
            worker.join(0.01)
        # four fonts and four variables (and whatever else earlier tests left to collect): no Tcl call on the worker
        assert deferred.handed_over >= 8
        tk_finalizers.drain()
        assert not fonts & set(root.tk.splitlist(root.tk.call("font", "names")))
        assert not any(root.tk.getboolean(root.tk.call("info", "exists", v)) for v in variables)
    finally:
        if enabled:
            gc.enable()
        root.destroy()
