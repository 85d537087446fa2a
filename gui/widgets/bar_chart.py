"""A bar chart drawn on a Tk canvas (the timestep histogram, the bucket chart): no plotting library needed."""

from __future__ import annotations

import math
import tkinter
from collections.abc import Sequence
from typing import Any

import customtkinter as ctk

BAR_COLOR = ("#3a7ebf", "#4a90d9")
AXIS_COLOR = ("gray40", "gray60")
TEXT_COLOR = ("gray10", "#DCE4EE")
BACKGROUND = ("gray92", "gray14")
MARGIN_LEFT = 56
MARGIN_RIGHT = 22  # room for half of the last x tick's label
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


def nice_ticks(high: float, most: int = 5, whole: bool = False) -> list[float]:
    """Round axis ticks from 0 to at least `high`: steps of 1, 2 or 5 × 10^k, at most `most` + 1 ticks; with `whole`
    (an axis of counts) steps of at least 1, so that no tick is half an image.

    `nice_ticks(3240)` → `[0, 1000, 2000, 3000, 4000]`; the axis ends at the last tick, so bars scale to it.
    """
    if high <= 0:
        return [0.0, 1.0]
    raw = high / most
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
    if whole:
        step = max(step, 1)
    count = math.ceil(high / step - 1e-9)
    return [round(i * step, 10) for i in range(count + 1)]


class BarChart(tkinter.Canvas):
    def __init__(self, master: Any, width: int = 480, height: int = 260, **kwargs: Any) -> None:
        super().__init__(
            master, width=width, height=height, highlightthickness=0, background=themed(BACKGROUND), **kwargs
        )
        self.values: list[float] = []
        self.labels: list[str] = []
        self.title = ""
        self.message = ""
        self.x_range: tuple[float, float] | None = None
        self.bind("<Configure>", lambda _e: self._redraw())

    def draw(
        self,
        values: Sequence[float],
        labels: Sequence[str] = (),
        title: str = "",
        x_range: tuple[float, float] | None = None,
    ) -> None:
        """Bars for `values`, on a value axis with round ticks. Under them either a label per bar (thinned out when
        there are many) or, with `x_range` (the bars cover that range of numbers in equal bins), round ticks."""
        self.values = [float(v) for v in values]
        self.labels = list(labels)
        self.title = title
        self.x_range = x_range
        self.message = ""
        self._redraw()

    def show_message(self, text: str) -> None:
        """A note instead of bars (computing…, not available)."""
        self.values, self.labels, self.message, self.x_range = [], [], text, None
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
        ticks = nice_ticks(max(self.values), whole=all(v.is_integer() for v in self.values))  # counts: whole ticks
        peak = ticks[-1]
        axis = themed(AXIS_COLOR)
        self.create_line(left, bottom, right, bottom, fill=axis)
        self.create_line(left, top, left, bottom, fill=axis)
        for tick in ticks:
            y = bottom - tick / peak * (bottom - top)
            self.create_line(left - 4, y, left, y, fill=axis)
            self.create_text(left - 6, y, text=format_count(tick), anchor="e", fill=text, tags="y-tick")
        count = len(self.values)
        step = (right - left) / count
        gap = 1 if step < 6 else max(1.0, step * 0.15)
        color = themed(BAR_COLOR)
        for i, value in enumerate(self.values):
            x0 = left + i * step + gap / 2
            x1 = left + (i + 1) * step - gap / 2
            y = bottom - (value / peak) * (bottom - top)
            self.create_rectangle(x0, y, max(x1, x0 + 1), bottom, fill=color, width=0, tags="bar")
        if self.x_range is not None:
            low, high = self.x_range
            for tick in nice_ticks(high - low):
                if tick > high - low:
                    break
                x = left + tick / (high - low) * (right - left)
                self.create_line(x, bottom, x, bottom + 4, fill=axis)
                self.create_text(x, bottom + 5, text=format_count(low + tick), anchor="n", fill=text, tags="x-tick")
        elif self.labels:
            shown = range(count) if count <= LABELLED_BARS else sorted({0, count // 2, count - 1})
            for i in shown:
                x = left + (i + 0.5) * step
                self.create_text(x, bottom + 4, text=self.labels[i], anchor="n", fill=text, tags="label")
