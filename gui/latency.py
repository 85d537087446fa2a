"""How responsive the window stays while training: the lateness of the Tk main loop's timer callbacks.

A callback is scheduled every `interval_ms` with `after()`; how much later than asked each one runs is the time the
loop was busy elsewhere (drawing, handling the trainer's events, or waiting for the GIL the trainer thread holds).
`benchmark_gui_latency` starts the demo training in a real window and measures until it ends.
"""

from __future__ import annotations

import math
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_INTERVAL_MS = 10


@dataclass(frozen=True)
class LatencyReport:
    samples: int
    p50_ms: float
    p95_ms: float
    max_ms: float
    seconds: float  # how long it measured

    def text(self) -> str:
        return (
            f"Tk loop latency over {self.seconds:.1f} s ({self.samples} timer callbacks): "
            f"p50 {self.p50_ms:.1f} ms, p95 {self.p95_ms:.1f} ms, max {self.max_ms:.1f} ms"
        )


@dataclass(frozen=True)
class GuiBenchmark:
    latency: LatencyReport
    outcome: str  # the footer's last status: "Finished (completed) …", or why it did not finish
    steps_per_second: str  # the footer's speed figure at the end


def percentile(values: list[float], fraction: float) -> float:
    """The value below which `fraction` of `values` lie (nearest rank); 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(fraction * len(ordered)) - 1))]


def measure_latency(
    root: Any,
    duration_s: float,
    interval_ms: int = DEFAULT_INTERVAL_MS,
    until: Callable[[], bool] | None = None,
) -> LatencyReport:
    """Run `root`'s main loop for `duration_s` (or until `until()` holds) and report how late the timers ran."""
    lateness: list[float] = []
    start = time.perf_counter()
    end = start + duration_s

    def tick(expected: float) -> None:
        now = time.perf_counter()
        lateness.append(max(0.0, now - expected) * 1000)
        if now >= end or (until is not None and until()):
            root.quit()
            return
        root.after(interval_ms, tick, now + interval_ms / 1000)

    root.after(interval_ms, tick, start + interval_ms / 1000)
    root.mainloop()
    return LatencyReport(
        samples=len(lateness),
        p50_ms=statistics.median(lateness) if lateness else 0.0,
        p95_ms=percentile(lateness, 0.95),
        max_ms=max(lateness, default=0.0),
        seconds=time.perf_counter() - start,
    )


def demo_app(work: Path, preset: str = "demo", train_function: Any = None, epochs: int | None = None) -> Any:
    """The app on `preset` with its outputs under `work` and no TensorBoard, as a user opens it (a display needed)."""
    import customtkinter as ctk

    from gui.app import App
    from onetrainer.config import load_preset

    config, _ = load_preset(preset)
    config.workspace_dir = str(work / "workspace")
    config.cache_dir = str(work / "cache")
    config.output_model_destination = str(work / "model.safetensors")
    config.concept_file_name = str(work / "concepts.json")
    config.sample_definition_file_name = str(work / "samples.json")
    config.tensorboard = False
    if epochs is not None:
        config.epochs = epochs
    ctk.set_appearance_mode("dark")
    return App(config, autosave=False, train_function=train_function)


def stop_run(app: Any) -> None:
    """Stop the app's run, if any, and let the poll hear the end."""
    if app.running:
        app.stop()
        app.runner.join(60)
        for _ in range(20):
            app.update()
            time.sleep(0.05)


def benchmark_gui_latency(
    work_dir: str | Path,
    preset: str = "demo",
    max_seconds: float = 600.0,
    interval_ms: int = DEFAULT_INTERVAL_MS,
    train_function: Any = None,
) -> GuiBenchmark:
    """Open the app on `preset` (outputs under `work_dir`, no TensorBoard), press Start and measure until it ends.

    Needs a display (DISPLAY, or Xvfb). The run stops after `max_seconds` if it has not finished by then.
    """
    app = demo_app(Path(work_dir), preset, train_function)
    try:
        app.update()
        if not app.start():
            raise RuntimeError(f"the run did not start: {app.footer.status}")
        report = measure_latency(app, max_seconds, interval_ms, until=lambda: not app.running)
        stop_run(app)
        return GuiBenchmark(report, app.footer.status, app.footer.speed_label.cget("text"))
    finally:
        app.destroy()


class _FirstStep:
    """A sink that notes the run's first step (the sender of input waits for it without touching Tk)."""

    def __init__(self) -> None:
        self.seen = threading.Event()

    def emit(self, event: Any) -> None:
        from onetrainer.training.events import Progress

        if isinstance(event, Progress):
            self.seen.set()

    def close(self) -> None:
        pass


def benchmark_input_latency(work_dir: str | Path, busy: int = 0, keys: int = 20, clicks: int = 20) -> list:
    """Open the app on the demo preset (trained long enough to outlast the measurement) with `busy` processes keeping
    cores busy beside it, click Start, and once it trains type into a field and click through the tabs
    (`gui/input_latency.py`): how long the window took to answer each kind of input."""
    from gui.input_latency import measure_input_latency, spin, stop_spinning

    app = demo_app(Path(work_dir), epochs=10_000)
    first_step = _FirstStep()
    app.runner.extra_sinks = lambda: [first_step]
    spinning = spin(busy)
    try:
        app.update()
        return measure_input_latency(app, keys, clicks, training=first_step.seen.is_set)
    finally:
        stop_spinning(spinning)
        stop_run(app)
        app.destroy()


GOAL_P95_MS = 50.0


def benchmark_part(required: bool, busy: int = 0) -> dict | bool | None:
    """`scripts/benchmark.py`'s GUI part: the Tk loop's latency while the demo trains in a real window (an Xvfb when
    there is no display), and the time the window takes to answer key presses and clicks meanwhile with `busy`
    processes loading the CPU. Returns the figures; None when no display can be had and the part was not asked for
    by itself; False when it was."""
    import tempfile

    from gui.display import NoDisplayError, display

    print("\nGUI responsiveness while the demo preset trains:")
    try:
        with display(), tempfile.TemporaryDirectory(prefix="onetrainer-benchmark-gui-") as tmp:
            result = benchmark_gui_latency(Path(tmp) / "loop")
            inputs = _input_part(Path(tmp) / "input", busy)
    except NoDisplayError as e:
        print(f"  not measured: {e}")
        return False if required else None
    latency = result.latency
    verdict = "met" if latency.p95_ms <= GOAL_P95_MS else "NOT met"
    print(f"  {latency.text()}\n  goal p95 <= {GOAL_P95_MS:.0f} ms: {verdict}; the run: {result.outcome}")
    return {
        "input": inputs,
        "samples": latency.samples,
        "p50_ms": latency.p50_ms,
        "p95_ms": latency.p95_ms,
        "max_ms": latency.max_ms,
        "seconds": latency.seconds,
        "goal_p95_ms": GOAL_P95_MS,
        "goal_met": latency.p95_ms <= GOAL_P95_MS,
        "outcome": result.outcome,
        "footer_speed": result.steps_per_second,
    }


def _input_part(work: Path, busy: int) -> list[dict] | str:
    """The input latency figures, printed; why not, where input cannot be sent (no libXtst)."""
    import os

    print(f"  input while it trains, {busy} busy process(es) beside it, load average {os.getloadavg()[0]:.1f}:")
    try:
        reports = benchmark_input_latency(work, busy)
    except OSError as e:
        print(f"    not measured: {e}")
        return str(e)
    for entry in reports:
        print(f"    {entry.text()}")
    return [vars(entry) for entry in reports]
