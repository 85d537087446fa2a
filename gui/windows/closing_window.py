"""What the app shows while it closes during a run: the run stops first (saving its model when it trained a step), which
can take a while, and the process must not end before; the main window stays until then and this says what it waits
for, with the run's latest status and the time waited."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import customtkinter as ctk

from gui.footer import format_duration
from gui.window_position import place_over


class ClosingWindow(ctk.CTkToplevel):
    def __init__(self, master: Any, waiting_for: str, on_quit_now: Callable[[], None]) -> None:
        super().__init__(master)
        self.title("Closing OneTrainer")
        self.resizable(False, False)
        self.grid_columnconfigure(0, weight=1)
        ctk.CTkLabel(
            self, text="The app closes once the training has stopped", font=ctk.CTkFont(size=15, weight="bold")
        ).grid(row=0, column=0, sticky="w", padx=16, pady=(14, 4))
        ctk.CTkLabel(self, text=waiting_for, justify="left", anchor="w", wraplength=440).grid(
            row=1, column=0, sticky="ew", padx=16
        )
        self.bar = ctk.CTkProgressBar(self, mode="indeterminate", width=440)
        self.bar.grid(row=2, column=0, sticky="ew", padx=16, pady=(12, 4))
        self.bar.start()
        self.status_label = ctk.CTkLabel(self, text="", justify="left", anchor="w", wraplength=440)
        self.status_label.grid(row=3, column=0, sticky="ew", padx=16)
        row = ctk.CTkFrame(self, fg_color="transparent")
        row.grid(row=4, column=0, sticky="ew", padx=12, pady=(8, 12))
        ctk.CTkLabel(row, text="Quit now ends the app at once: a model being saved is lost.", anchor="w").pack(
            side="left", padx=4
        )
        self.quit_button = ctk.CTkButton(row, text="Quit now", width=100, command=on_quit_now)
        self.quit_button.pack(side="right", padx=4)
        # Its close button cannot skip the wait by mistake: Quit now says what skipping it costs.
        self.protocol("WM_DELETE_WINDOW", self.lift)
        self.transient(master)
        self.status = ""
        place_over(self, master)

    def show(self, status: str, seconds: float) -> None:
        """The run's latest status line, after the time waited so far."""
        self.status = status
        self.status_label.configure(text=f"{format_duration(seconds)}  {status}")

    def destroy(self) -> None:
        self.bar.stop()
        super().destroy()
