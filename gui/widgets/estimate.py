"""The memory and time estimate beside Start (`onetrainer/training/estimate.py`), refreshed after config edits.

The estimate runs on a worker thread (the first one builds the full-size model on the meta device, a few seconds)
on a copy of the config; the label changes only on the Tk thread. A newer edit cancels the running estimate, and a
run's start pauses them (its load would otherwise wait for the measurement, which holds the model library) until
the run ends. A whole new config (a preset, a config file) clears the figure at once and estimates without waiting
for more edits: the previous config's figure is never shown beside the new one.
"""

from __future__ import annotations

import contextlib
import copy
import threading
from collections.abc import Callable
from functools import lru_cache
from typing import Any

import customtkinter as ctk

from gui.background import BackgroundJob, BackgroundResult
from gui.widgets.tooltip import add_tooltip

DELAY_MS = 700
TOO_BIG_COLOR = ("#b3261e", "#ff8a80")
UNKNOWN = "VRAM –"
ESTIMATING = "estimating memory…"


@lru_cache(maxsize=4)
def _throughput(device: str) -> float | None:
    from onetrainer.training.estimate import device_throughput

    return device_throughput(device)


def _free(device: str) -> float | None:
    from onetrainer.training.estimate import free_memory

    return free_memory(device)


class EstimateLabel(ctk.CTkLabel):
    """ "≈ 5.1 GiB VRAM · 9.3 GiB RAM · 0.40 s/step" ("≈ 1.1 GiB RAM · 0.05 s/step on the CPU" where the CPU trains);
    in red with the first setting that helps when it exceeds free memory."""

    def __init__(self, master: Any, model, on_click: Callable[[], Any] | None = None) -> None:
        super().__init__(master, text=UNKNOWN, anchor="e", justify="right")
        self._default_color = self.cget("text_color")
        self.model = model
        if on_click is not None:  # the window's "fit to a VRAM budget"
            self.configure(cursor="hand2")
            self.bind("<Button-1>", lambda _event: on_click())
            add_tooltip(self, "Click to fit the run to a VRAM budget (layer offloading, 8-bit weights, batch size…)")
        self.free_bytes: Callable[[str], float | None] = _free
        self.result = None
        self._pending: str | None = None
        self._job: BackgroundJob | None = None
        self._cancel = threading.Event()  # the running job's: set when a newer edit or a run's start replaces it
        self._paused = False
        self._unsubscribe = model.subscribe(self._changed)
        self.schedule()

    @property
    def busy(self) -> bool:
        """A refresh is scheduled or its worker still runs (the first one builds a full-size model on the meta
        device, seconds of work beside the window)."""
        job = self._job
        return self._pending is not None or (job is not None and not job.done and not job.cancelled)

    def _changed(self, path: str | None) -> None:
        if path is not None:  # one edit: more may follow (typing), estimate once they pause
            self.schedule()
            return
        # A new config (path None: a preset, a config file): its figure is unknown from now on.
        self.result = None
        self._stop_job()
        self.configure(text=ESTIMATING, text_color=self._default_color)
        self.schedule(delay_ms=0)

    def schedule(self, delay_ms: int = DELAY_MS) -> None:
        if self._pending is not None:
            self.after_cancel(self._pending)
        self._pending = None if self._paused else self.after(delay_ms, self.refresh_now)

    def pause(self) -> None:
        """A run starts: stop the running estimate (its measurement holds the model library the run's load needs,
        and competes with the run for the CPU) and make none until `resume`."""
        self._paused = True
        if self._pending is not None:
            self.after_cancel(self._pending)
            self._pending = None
        self._stop_job()

    def resume(self) -> None:
        self._paused = False
        self.schedule()

    def destroy(self) -> None:
        # A measurement left running would go on holding the model library (and the interpreter) after the window
        # is gone: a sampling tool or the next window would wait on it.
        self._paused = True
        with contextlib.suppress(ValueError):  # destroyed twice: unsubscribed already
            self._unsubscribe()
        self._stop_job()
        super().destroy()

    def _stop_job(self) -> None:
        self._cancel.set()
        if self._job is not None:
            self._job.cancel()

    def refresh_now(self) -> None:
        self._pending = None
        if self._paused:
            return
        self._stop_job()
        config = copy.deepcopy(self.model.config)
        free_bytes = self.free_bytes
        cancel = self._cancel = threading.Event()

        def work():
            from onetrainer.training.estimate import EstimateCancelled, estimate

            device = config.train_device
            try:
                return estimate(config, free_bytes(device), _throughput(device), cancelled=cancel.is_set)
            except EstimateCancelled:
                return None

        self._job = BackgroundJob(self, work, self._show)

    def _show(self, done: BackgroundResult) -> None:
        from onetrainer.training.estimate import size_text

        self.result = done.value
        if done.error is not None or done.value is None:
            self.configure(text=UNKNOWN, text_color=self._default_color)
            return
        result = done.value
        text = result.summary()  # "≈ 5.1 GiB VRAM · 9.3 GiB RAM · 0.40 s/step", the CPU's RAM where the CPU trains
        if result.fits is False:
            text += f" > {size_text(result.free_bytes)} free"
            if result.advice:
                text += f"\ntry {result.advice[0]}, or click to fit"
            self.configure(text=text, text_color=TOO_BIG_COLOR)
        else:
            self.configure(text=text, text_color=self._default_color)


def attach_estimate(footer, model, on_click: Callable[[], Any] | None = None) -> EstimateLabel:
    """Put the estimate beside the footer's Start button: right-aligned just above the buttons, in their frame (the
    buttons' row itself has no room left at 1024 px)."""
    label = EstimateLabel(footer.start_button.master, model, on_click)
    first = footer.start_button.master.pack_slaves()[0]
    label.configure(wraplength=420)
    label.pack(side="top", anchor="e", padx=6, before=first)
    return label
