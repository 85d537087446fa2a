"""The app's log: what the console shows (the run's events as lines, and warnings logged by any library), kept in
memory and shown in a window that follows it live (the footer's Log button).

Lines may be added from any thread (logging handlers run on the trainer thread); the window polls on the Tk thread.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import customtkinter as ctk

from gui.window_position import place_over
from onetrainer.training.events import (
    Event,
    Failed,
    Metrics,
    Progress,
    Started,
    describe,
)

MAX_LINES = 5000
POLL_MS = 250


class LogBuffer:
    def __init__(self, limit: int = MAX_LINES) -> None:
        self._lines: list[str] = []
        self._dropped = 0  # lines dropped from the start, so `since()` counts stay valid
        self._limit = limit
        self._lock = threading.Lock()

    def add(self, text: str) -> None:
        with self._lock:
            self._lines.extend(text.splitlines() or [""])
            excess = len(self._lines) - self._limit
            if excess > 0:
                del self._lines[:excess]
                self._dropped += excess

    @property
    def total(self) -> int:
        """Lines added so far (dropped ones included)."""
        with self._lock:
            return self._dropped + len(self._lines)

    def since(self, count: int) -> list[str]:
        """The lines added after the first `count`."""
        with self._lock:
            return self._lines[max(0, count - self._dropped) :]

    @property
    def text(self) -> str:
        with self._lock:
            return "\n".join(self._lines)


class LogHandler(logging.Handler):
    """Logging records into a buffer (what would reach the console's stderr)."""

    def __init__(self, buffer: LogBuffer, level: int = logging.WARNING) -> None:
        super().__init__(level)
        self.buffer = buffer
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.buffer.add(self.format(record))
        except Exception:  # a log line must never break what logged it
            self.handleError(record)


class EventLines:
    """The run's events as the console prints them (a line per epoch instead of a progress bar)."""

    def __init__(self) -> None:
        self._loss: float | None = None

    def line(self, event: Event) -> str | None:
        if isinstance(event, Metrics):
            self._loss = event.smooth_loss
            return None
        if isinstance(event, Progress):
            if event.epoch_step != event.steps_per_epoch:
                return None
            loss = f", loss {self._loss:.4f}" if self._loss is not None else ""
            return (
                f"epoch {event.epoch + 1}/{event.total_epochs} done: step {event.global_step}/{event.total_steps}, "
                f"{event.steps_per_second:.2f} it/s{loss}"
            )
        text = describe(event)
        if isinstance(event, Started) and event.log_path:
            return f"{text} (log: {event.log_path})"
        if isinstance(event, Failed):
            lines = [text, event.traceback.rstrip()] if event.traceback else [text]
            return "\n".join(lines + ([f"Log: {event.log_path}"] if event.log_path else []))
        return text


class LogWindow(ctk.CTkToplevel):
    def __init__(self, master: Any, buffer: LogBuffer) -> None:
        super().__init__(master)
        self.buffer = buffer
        self.title("Log")
        place_over(self, master, (860, 460))
        self.minsize(480, 240)
        self.grid_columnconfigure(0, weight=1)
        self.grid_rowconfigure(0, weight=1)
        self.textbox = ctk.CTkTextbox(self, wrap="none", font=ctk.CTkFont(family="monospace", size=12))
        self.textbox.grid(row=0, column=0, sticky="nsew", padx=10, pady=(10, 4))
        buttons = ctk.CTkFrame(self, fg_color="transparent")
        buttons.grid(row=1, column=0, sticky="e", padx=10, pady=(0, 10))
        ctk.CTkButton(buttons, text="Copy", width=90, command=self._copy).pack(side="left", padx=4)
        ctk.CTkButton(buttons, text="Close", width=90, command=self.destroy).pack(side="left", padx=4)
        self._shown = 0
        self._after: str | None = None
        self.follow()

    @property
    def text(self) -> str:
        return self.textbox.get("1.0", "end-1c")

    def follow(self) -> None:
        """Append the lines added since the last look, scrolled to the end when it was there."""
        lines = self.buffer.since(self._shown)
        self._shown = self.buffer.total
        if lines:
            at_end = self.textbox.yview()[1] >= 0.999
            self.textbox.insert("end", ("\n" if self.text else "") + "\n".join(lines))
            if at_end:
                self.textbox.see("end")
        self._after = self.after(POLL_MS, self.follow)

    def destroy(self) -> None:
        if self._after is not None:
            self.after_cancel(self._after)
            self._after = None
        super().destroy()

    def _copy(self) -> None:
        self.clipboard_clear()
        self.clipboard_append(self.text)
