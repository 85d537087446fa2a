"""The queue of runs (`onetrainer/training/job_queue.py`): each entry with its status, reordering, removal, Run queue.

The window reads the queue file whenever the app says it changed and every few seconds (a terminal's
`job_queue.py` edits the same file); the app does the running (`App.run_queue`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import customtkinter as ctk

from gui.window_position import place_over
from onetrainer.training.job_queue import FAILED, FINISHED, RUNNING, STOPPED, QueueEntry, QueueError

if TYPE_CHECKING:
    from gui.app import App

REFRESH_MS = 3000
STATUS_COLORS = {
    RUNNING: ("#1f6aa5", "#5fa8e8"),
    FINISHED: ("#2e7d32", "#66bb6a"),
    STOPPED: ("#8a6d00", "#e0b000"),
    FAILED: ("#b00020", "#ef5350"),
}


class QueueWindow(ctk.CTkToplevel):
    def __init__(self, app: App) -> None:
        super().__init__(app)
        self.app = app
        self.title("Queue of runs")
        self.grid_columnconfigure(0, weight=1)
        self.grid_rowconfigure(1, weight=1)
        self.heading = ctk.CTkLabel(self, text="", anchor="w", justify="left")
        self.heading.grid(row=0, column=0, sticky="ew", padx=12, pady=(10, 4))
        self.list_frame = ctk.CTkScrollableFrame(self, width=640, height=300)
        self.list_frame.grid(row=1, column=0, sticky="nsew", padx=10)
        self.list_frame.grid_columnconfigure(1, weight=1)
        self.selected = ctk.StringVar(value="")  # the chosen entry's id
        self.entries: list[QueueEntry] = []
        self.rows: list[tuple[ctk.CTkRadioButton, ctk.CTkLabel]] = []
        self.message = ctk.CTkLabel(self, text="", anchor="w", justify="left", wraplength=640)
        self.message.grid(row=2, column=0, sticky="ew", padx=12, pady=(4, 0))
        buttons = ctk.CTkFrame(self, fg_color="transparent")
        buttons.grid(row=3, column=0, sticky="ew", padx=8, pady=(4, 10))
        self.up_button = ctk.CTkButton(buttons, text="Up", width=60, command=lambda: self.move(-1))
        self.down_button = ctk.CTkButton(buttons, text="Down", width=60, command=lambda: self.move(1))
        self.remove_button = ctk.CTkButton(buttons, text="Remove", width=80, command=self.remove)
        self.requeue_button = ctk.CTkButton(buttons, text="Queue again", width=100, command=self.requeue)
        self.clear_button = ctk.CTkButton(buttons, text="Clear done", width=90, command=self.clear_done)
        for button in (self.up_button, self.down_button, self.remove_button, self.requeue_button, self.clear_button):
            button.pack(side="left", padx=3)
        self.run_button = ctk.CTkButton(buttons, text="Run queue", width=110, command=self.run_or_stop)
        self.run_button.pack(side="right", padx=3)
        self.transient(app)
        place_over(self, app, (700, 460))
        self._after: str | None = None
        self.refresh()

    # -- showing -------------------------------------------------------------------------------------------------

    def refresh(self) -> None:
        """Read the queue again and show it (the selection stays on its entry)."""
        if self._after is not None:
            self.after_cancel(self._after)
        self._after = self.after(REFRESH_MS, self.refresh)
        problem = ""
        try:
            entries = self.app.job_queue.entries()
        except QueueError as e:
            problem = str(e)
            entries = []
        if [(e.id, e.status, e.reason) for e in entries] != [(e.id, e.status, e.reason) for e in self.entries] or (
            len(self.rows) != len(entries)
        ):
            self._show(entries)
            self.say("")  # a refusal's message is about the list as it was
        self.entries = entries
        waiting = sum(1 for e in entries if e.status == "queued")
        self.heading.configure(
            text=f"{len(entries)} entries, {waiting} waiting. Each keeps its config as it was queued."
            if entries
            else "The queue is empty: Add to queue (in the main window's footer) queues the config being edited."
        )
        if problem:
            self.heading.configure(text="The queue cannot be read")
            self.say(problem, "error")
        self.run_button.configure(text="Stop queue" if self.app.queue_running else "Run queue")
        if not any(e.id == self.selected.get() for e in entries):
            self.selected.set(entries[0].id if entries else "")

    def _show(self, entries: list[QueueEntry]) -> None:
        for radio, label in self.rows:
            radio.destroy()
            label.destroy()
        self.rows = []
        for position, entry in enumerate(entries, 1):
            radio = ctk.CTkRadioButton(
                self.list_frame, text=f"{position}. {entry.name}", variable=self.selected, value=entry.id
            )
            radio.grid(row=position, column=0, sticky="w", padx=4, pady=2)
            detail = entry.status
            if entry.kind == "remote":  # trains on the host of its cloud block
                detail += f", remote ({entry.config.get('cloud', {}).get('type', 'LINUX')})"
            if entry.reason:
                detail += f": {entry.reason.strip().splitlines()[0]}"
            elif entry.config.get("output_model_destination"):  # which run it is, where names repeat
                detail += f": writes {entry.config['output_model_destination']}"
            label = ctk.CTkLabel(self.list_frame, text=detail, anchor="w", justify="left", wraplength=360)
            color = STATUS_COLORS.get(entry.status)
            if color is not None:
                label.configure(text_color=color)
            label.grid(row=position, column=1, sticky="ew", padx=4, pady=2)
            self.rows.append((radio, label))

    def status_of(self, position: int) -> str:
        """What row `position` (1 is the first) says of its entry's status."""
        return self.rows[position - 1][1].cget("text")

    def say(self, text: str, level: str = "info") -> None:
        colors = {"info": ("gray10", "gray90"), "error": STATUS_COLORS[FAILED]}
        self.message.configure(text=text, text_color=colors[level])

    # -- actions -------------------------------------------------------------------------------------------------

    def _change(self, action) -> None:
        try:
            action(self.app.job_queue)
        except QueueError as e:
            self.say(str(e), "error")
        else:
            self.say("")
        self.app.queue_changed()

    def move(self, step: int) -> None:
        chosen = self.selected.get()
        ids = [e.id for e in self.entries]
        if chosen in ids:
            self._change(lambda queue: queue.move(chosen, ids.index(chosen) + 1 + step))

    def remove(self) -> None:
        chosen = self.selected.get()
        if chosen:
            self._change(lambda queue: queue.remove(chosen))

    def requeue(self) -> None:
        chosen = self.selected.get()
        if chosen:
            self._change(lambda queue: queue.requeue(chosen))

    def clear_done(self) -> None:
        self._change(lambda queue: queue.clear_done())

    def run_or_stop(self) -> None:
        if self.app.queue_running:
            self.app.stop_queue()
        elif not self.app.run_queue():
            self.say(self.app.footer.status, "error")  # why not (a run going, another process running the queue)
            return
        self.refresh()

    def destroy(self) -> None:
        if self._after is not None:
            self.after_cancel(self._after)
            self._after = None
        super().destroy()


def open_queue_window(app: Any) -> QueueWindow:
    window = getattr(app, "queue_window", None)
    if window is not None and window.winfo_exists():
        window.refresh()
        window.lift()
        return window
    return QueueWindow(app)
