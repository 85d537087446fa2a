"""The concept window's statistics: the concept's part of the preflight report, with a chart of its buckets, and its
clips counted (frames, duration, unreadable ones named) whatever the model type.

The report reads every image's size and every clip's header, so it is made on a worker thread from a packed copy of
the config.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import customtkinter as ctk

from gui.background import BackgroundJob, BackgroundResult, run_in_background
from gui.concept_preview import ClipCensus, concept_folder
from gui.preflight_view import PREFLIGHT_MISSING, ConceptStatistics, concept_statistics
from gui.widgets.bar_chart import BarChart
from onetrainer.config import pack

if TYPE_CHECKING:
    from gui.model import ConfigModel

MUTED_TEXT = ("gray40", "gray60")
ERROR_TEXT = ("#b03a2e", "#ff7b72")
NOTE_TEXT = ("#9a6700", "#e3b341")


def _preflight(config: Any) -> Any:
    from onetrainer.data.preflight import preflight_report  # imported late: it may pull in more than the window

    return preflight_report(config, resolve=concept_folder)  # `tiny:images` too


def _report_and_clips(config: Any, index: int) -> tuple[Any, ClipCensus | None]:
    """The preflight report and the census of concept `index`'s clips, as the report counted them (the same
    `data.video.clip_census` the CLI's preflight prints; None: the concept is not in the report, as it is disabled)."""
    report = _preflight(config)
    entry = next((c for c in report.concepts if c.index == index), None)
    return report, entry.clips if entry is not None else None


class StatisticsPane:
    def __init__(self, parent: Any, model: ConfigModel, index: int) -> None:
        self.model = model
        self.index = index
        self.job: BackgroundJob | None = None
        self.statistics: ConceptStatistics | None = None
        self.frame = ctk.CTkFrame(parent)
        self.frame.grid_columnconfigure(1, weight=1)
        self.frame.grid_rowconfigure(2, weight=1)
        bar = ctk.CTkFrame(self.frame, fg_color="transparent")
        bar.grid(row=0, column=0, columnspan=2, sticky="ew", padx=10, pady=(8, 4))
        self.refresh_button = ctk.CTkButton(bar, text="Refresh", width=100, command=self.compute)
        self.refresh_button.pack(side="left")
        self.status = ctk.CTkLabel(bar, text="", text_color=MUTED_TEXT, anchor="w", justify="left", wraplength=760)
        self.status.pack(side="left", padx=10)
        self.facts = ctk.CTkFrame(self.frame, fg_color="transparent")
        self.facts.grid(row=1, column=0, sticky="nw", padx=10, pady=4)
        self.table = ctk.CTkTextbox(self.frame, height=140, wrap="none", font=ctk.CTkFont(family="monospace"))
        self.table.grid(row=1, column=1, sticky="nsew", padx=10, pady=4)
        self.chart = BarChart(self.frame, width=760, height=240)
        self.chart.grid(row=2, column=0, columnspan=2, sticky="nsew", padx=10, pady=(4, 10))

    def compute(self) -> None:
        """Make the report again (the folder's files may have changed)."""
        self.cancel()
        packed, _ = pack(self.model.config)
        self.status.configure(text="Reading the concept's images and clips…", text_color=MUTED_TEXT)
        self.chart.show_message("computing…")
        self.refresh_button.configure(state="disabled")
        index = self.index
        self.job = run_in_background(self.frame, lambda: _report_and_clips(packed, index), self._done)

    def cancel(self) -> None:
        if self.job is not None:
            self.job.cancel()
            self.job = None

    def _done(self, result: BackgroundResult) -> None:
        self.job = None
        self.refresh_button.configure(state="normal")
        if isinstance(result.error, ImportError):
            self._failed(PREFLIGHT_MISSING)
            return
        if result.error is not None:
            self._failed(f"The report failed: {type(result.error).__name__}: {result.error}")
            return
        report, census = result.value
        self.show(concept_statistics(report, self.index, census))

    def _failed(self, text: str) -> None:
        self.statistics = None
        self.status.configure(text=text, text_color=ERROR_TEXT)
        self.chart.show_message(text)

    def show(self, stats: ConceptStatistics) -> None:
        self.statistics = stats
        self.status.configure(text="", text_color=MUTED_TEXT)
        for child in self.facts.winfo_children():
            child.destroy()
        for row, (label, value) in enumerate(stats.facts):
            ctk.CTkLabel(self.facts, text=label, anchor="w").grid(row=row, column=0, sticky="w", padx=(0, 12))
            ctk.CTkLabel(self.facts, text=value, anchor="w").grid(row=row, column=1, sticky="w")
        if stats.notes:
            self.status.configure(text="\n".join(stats.notes), text_color=NOTE_TEXT)
        self._show_table(stats)
        if stats.bucket_images:
            self.chart.draw(stats.bucket_images, stats.bucket_labels, title="images per bucket")
        else:
            self.chart.show_message("No buckets: the concept has no usable images.")

    def _show_table(self, stats: ConceptStatistics) -> None:
        rows = [stats.bucket_headers, *stats.bucket_rows] if stats.bucket_rows else []
        widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))] if rows else []
        lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)) for row in rows]
        self.table.configure(state="normal")
        self.table.delete("1.0", "end")
        self.table.insert("1.0", "\n".join(lines))
        self.table.configure(state="disabled")
