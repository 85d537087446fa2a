"""One wording for an event wherever it is written: the console, the run's log file and the GUI's Log window."""

from __future__ import annotations

import io
import re

import pytest

from gui.log_view import EventLines
from onetrainer.training.console import ConsoleSink
from onetrainer.training.events import (
    CacheProgress,
    Failed,
    Finished,
    Metrics,
    Progress,
    SampleReady,
    Started,
    Status,
    Warning_,
    describe,
)
from onetrainer.training.workspace import LogFileSink

SHARED = [
    (
        Started("run-1", total_steps=6, total_epochs=2, steps_per_epoch=3),
        "Training run-1: 2 epochs x 3 steps = 6 steps",
    ),
    (SampleReady(5, 0, "a <cat>", "/s/0.png"), "sample 0 ('a <cat>'): /s/0.png"),
    (Status("caching 4 images"), "caching 4 images"),
    (CacheProgress("latents", 0, 40, 0.0), "caching latents: 40 images to encode"),
    (Warning_("no captions"), "warning: no captions"),
    (Finished("completed", "/m/out.safetensors"), "Finished (completed): /m/out.safetensors"),
    (Finished("stopped"), "Finished (stopped)"),
]


@pytest.mark.parametrize(("event", "line"), SHARED)
def test_each_output_writes_the_shared_line(tmp_path, event, line):
    assert describe(event) == line
    assert EventLines().line(event) == line
    console = io.StringIO()
    sink = ConsoleSink(console)
    sink.emit(event)
    sink.close()
    assert line in console.getvalue()
    log = LogFileSink(tmp_path / "run.log")
    log.emit(event)
    log.close()
    assert line in (tmp_path / "run.log").read_text(encoding="utf-8")


def test_a_failure_adds_its_traceback_in_the_log_and_the_log_window(tmp_path):
    event = Failed("CUDA out of memory", "Traceback: here", "/w/logs/run.log")
    assert describe(event) == "Training failed: CUDA out of memory"
    assert EventLines().line(event) == "Training failed: CUDA out of memory\nTraceback: here\nLog: /w/logs/run.log"
    log = LogFileSink(tmp_path / "run.log")
    log.emit(event)
    log.close()
    assert "Training failed: CUDA out of memory\nTraceback: here" in (tmp_path / "run.log").read_text(encoding="utf-8")


def test_caching_shows_a_progress_bar_on_the_terminal_and_one_line_in_the_logs(tmp_path):
    console = io.StringIO()
    sink = ConsoleSink(console)
    passes = [("latents", 3), ("captions", 2)]
    for kind, total in passes:
        for done in range(total + 1):
            sink.emit(CacheProgress(kind, done, total, seconds=2.0 * done))
    sink.emit(Started("run-1", total_steps=6, total_epochs=2, steps_per_epoch=3))
    sink.close()
    shown = console.getvalue()
    # Each pass: its line, then a bar with its count (tqdm's rate and time left), finished before the next one.
    assert shown.index("caching latents: 3 images to encode") < shown.index("caching latents: 100%")
    assert re.search(r"3/3 \[[^]]*image", shown) and re.search(r"2/2 \[[^]]*caption", shown)
    assert shown.index("caching latents: 100%") < shown.index("caching captions: 2 captions to encode")
    assert shown.index("caching captions: 100%") < shown.index("Training run-1")
    # Only the start of a pass is a line: the log and the Log window get no line per entry.
    lines = EventLines()
    assert [lines.line(CacheProgress("latents", done, 3, done)) for done in range(4)] == [
        "caching latents: 3 images to encode",
        None,
        None,
        None,
    ]


def test_the_terminals_bar_names_the_loss_and_the_smoothed_loss_as_the_footer_does():
    console = io.StringIO()
    sink = ConsoleSink(console)
    sink.emit(Started("run-1", total_steps=6, total_epochs=2, steps_per_epoch=3))
    sink.emit(Metrics(1, loss=0.25, smooth_loss=0.75, learning_rates={"lr": 1e-4}))
    sink.emit(Progress(1, 6, 0, 2, 1, 3, 4.0, 1.25))
    sink.close()
    assert "loss=0.2500" in console.getvalue() and "smooth=0.7500" in console.getvalue()
