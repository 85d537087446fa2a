"""A bar chart drawn on a Tk canvas (the timestep histogram, the bucket chart): no plotting library needed."""

from __future__ import annotations

import tkinter
from collections.abc import Sequence
from typing import Any

import customtkinter as ctk

BAR_COLOR = ("#3a7ebf", "#4a90d9")
AXIS_COLOR = ("gray40", "gray60")
TEXT_COLOR = ("gray10", "#DCE4EE")
BACKGROUND = ("gray92", "gray14")
MARGIN_LEFT = 56
MARGIN_RIGHT = 12
MARGIN_TOP = 24
MARGIN_BOTTOM = 34
LABELLED_BARS = 16  # with more bars, only the first, middle and last get a label


def themed(color: str | tuple[str, str]) -> str:
    """The light or dark variant of a customtkinter colour pair, for plain Tk widgets."""
    if isinstance(color, str):
        return color
    return color[1] if ctk.get_appearance_mode() == "Dark" else color[0]


def format_count(value: float) -> str:
    """An axis label: `12k`, `3240`, `0.5`."""
    if value >= 10_000:
        return f"{value / 1000:.0f}k"
    if value >= 100 or value == int(value):
        return str(round(value))
    return f"{value:.2g}"


class BarChart(tkinter.Canvas):
    def __init__(self, master: Any, width: int = 480, height: int = 260, **kwargs: Any) -> None:
        super().__init__(
            master, width=width, height=height, highlightthickness=0, background=themed(BACKGROUND), **kwargs
        )
        self.values: list[float] = []
        self.labels: list[str] = []
        self.title = ""
        self.message = ""
        self.bind("<Configure>", lambda _e: self._redraw())

    def draw(self, values: Sequence[float], labels: Sequence[str] = (), title: str = "") -> None:
        """Bars for `values` (labels under them, thinned out when there are many), scaled to the largest."""
        self.values = [float(v) for v in values]
        self.labels = list(labels)
        self.title = title
        self.message = ""
        self._redraw()

    def show_message(self, text: str) -> None:
        """A note instead of bars (computing…, not available)."""
        self.values, self.labels, self.message = [], [], text
        self._redraw()

    @property
    def bar_count(self) -> int:
        return len(self.find_withtag("bar"))

    def _redraw(self) -> None:
        self.delete("all")
        # Before the canvas is mapped its size is 1x1: use the requested size.
        width = self.winfo_width() if self.winfo_width() > 1 else int(self.cget("width"))
        height = self.winfo_height() if self.winfo_height() > 1 else int(self.cget("height"))
        text = themed(TEXT_COLOR)
        if self.title:
            self.create_text(MARGIN_LEFT, 6, text=self.title, anchor="nw", fill=text, tags="title")
        if self.message or not self.values:
            self.create_text(width / 2, height / 2, text=self.message, fill=text, width=width - 40, tags="message")
            return
        left, right = MARGIN_LEFT, width - MARGIN_RIGHT
        top, bottom = MARGIN_TOP, height - MARGIN_BOTTOM
        peak = max(self.values) or 1.0
        axis = themed(AXIS_COLOR)
        self.create_line(left, bottom, right, bottom, fill=axis)
        self.create_line(left, top, left, bottom, fill=axis)
        for fraction in (0.0, 0.5, 1.0):
            y = bottom - fraction * (bottom - top)
            self.create_line(left - 4, y, left, y, fill=axis)
            self.create_text(left - 6, y, text=format_count(peak * fraction), anchor="e", fill=text)
        count = len(self.values)
        step = (right - left) / count
        gap = 1 if step < 6 else max(1.0, step * 0.15)
        color = themed(BAR_COLOR)
        for i, value in enumerate(self.values):
            x0 = left + i * step + gap / 2
            x1 = left + (i + 1) * step - gap / 2
            y = bottom - (value / peak) * (bottom - top)
            self.create_rectangle(x0, y, max(x1, x0 + 1), bottom, fill=color, width=0, tags="bar")
        if self.labels:
            shown = range(count) if count <= LABELLED_BARS else sorted({0, count // 2, count - 1})
            for i in shown:
                x = left + (i + 0.5) * step
                self.create_text(x, bottom + 4, text=self.labels[i], anchor="n", fill=text, tags="label")
