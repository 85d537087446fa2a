"""The timestep distribution's "…" window: its settings beside a histogram of the timesteps they draw.

The histogram comes from `onetrainer.noise.timesteps.timestep_histogram` (torch), computed on a worker thread from
a copy of the config, and is redrawn when a setting changes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import customtkinter as ctk

from gui.background import BackgroundJob, BackgroundResult, run_in_background
from gui.forms.form import Form
from gui.forms.selection import form_fields
from gui.widgets.bar_chart import BarChart
from gui.window_position import place_over

if TYPE_CHECKING:
    from gui.dialogs import Dialogs
    from gui.model import ConfigModel

TIMESTEP_FIELDS = (
    "timestep_distribution",
    "min_noising_strength",
    "max_noising_strength",
    "noising_weight",
    "noising_bias",
    "timestep_shift",
    "dynamic_timestep_shifting",  # flow-matching models; the histogram does not show it (nor does OneTrainer's)
)
BINS = 100
NUM_TIMESTEPS = 1000
SAMPLES = 200_000  # enough for a smooth histogram, fast enough to follow typing
REDRAW_DELAY_MS = 200
MUTED_TEXT = ("gray40", "gray60")


def histogram(config: Any) -> list[float]:
    # torch: imported when the window first draws
    from onetrainer.noise.timesteps import timestep_histogram
    from onetrainer.training.settings import timestep_settings

    return [float(v) for v in timestep_histogram(timestep_settings(config), bins=BINS, samples=SAMPLES).tolist()]


class TimestepWindow(ctk.CTkToplevel):
    def __init__(self, master: Any, model: ConfigModel, dialogs: Dialogs | None) -> None:
        super().__init__(master)
        self.model = model
        self.job: BackgroundJob | None = None
        self.counts: list[float] = []
        self._pending: str | None = None
        self._closed = False
        self.title("Timestep distribution")
        place_over(self, master, (1040, 460))
        self.minsize(800, 380)
        self.grid_columnconfigure(1, weight=1)
        self.grid_rowconfigure(0, weight=1)
        fields = [f for f in form_fields(model.config, "training") if f.path in TIMESTEP_FIELDS]
        self.form = Form(self, model, dialogs, "timesteps", columns=1, default_group="Noise", fields=fields)
        self.form.frame.grid(row=0, column=0, sticky="nw", padx=(8, 0), pady=8)
        right = ctk.CTkFrame(self)
        right.grid(row=0, column=1, sticky="nsew", padx=8, pady=8)
        right.grid_columnconfigure(0, weight=1)
        right.grid_rowconfigure(0, weight=1)
        self.chart = BarChart(right, width=560, height=340)
        self.chart.grid(row=0, column=0, sticky="nsew", padx=8, pady=(8, 2))
        self.axis_note = ctk.CTkLabel(
            right, text="timestep 0 (little noise)  →  999 (pure noise)", text_color=MUTED_TEXT
        )
        self.axis_note.grid(row=1, column=0, pady=(0, 8))
        ctk.CTkButton(self, text="Close", width=100, command=self.close).grid(
            row=1, column=1, sticky="e", padx=12, pady=(0, 10)
        )
        self._unsubscribe = model.subscribe(self._config_changed)
        self.protocol("WM_DELETE_WINDOW", self.close)
        self.redraw()

    def redraw(self) -> None:
        """Compute the histogram of the current settings (on a worker thread) and draw it."""
        self._pending = None
        if self.job is not None:
            self.job.cancel()
        self.chart.show_message("computing…")
        config = self.model.config.copy()  # the worker reads its own copy while the window goes on editing
        self.job = run_in_background(self, lambda: histogram(config), self._done)

    def _done(self, result: BackgroundResult) -> None:
        self.job = None
        if isinstance(result.error, ImportError):
            self.chart.show_message(f"The histogram is not available: {result.error}")
        elif result.error is not None:
            self.chart.show_message(f"These settings cannot be drawn: {result.error}")
        else:
            self.counts = result.value
            # The bins cover the timesteps 0–1000 evenly: round ticks under them, not the bins' odd edges.
            self.chart.draw(self.counts, x_range=(0, NUM_TIMESTEPS))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._unsubscribe()
        if self.job is not None:
            self.job.cancel()
        if self._pending is not None:
            self.after_cancel(self._pending)
        self.destroy()

    def _config_changed(self, path: str | None) -> None:
        if self._closed:
            return
        if path is None or path in TIMESTEP_FIELDS:
            if path is None:
                self.form.refresh()
            if self._pending is not None:
                self.after_cancel(self._pending)
            self._pending = self.after(REDRAW_DELAY_MS, self.redraw)
