"""The Tk loop's latency while training runs (the measurement `scripts/benchmark.py --gui` reports); no speed goal."""

from __future__ import annotations

from pathlib import Path

import pytest

from gui.latency import benchmark_gui_latency, measure_latency, percentile

pytestmark = pytest.mark.gui


def test_percentile() -> None:
    assert percentile([], 0.5) == 0.0
    assert percentile([5.0, 1.0, 3.0, 2.0, 4.0], 0.5) == 3.0
    assert percentile(list(map(float, range(1, 101))), 0.95) == 95.0


def test_latency_is_measured_while_a_run_holds_the_trainer_thread(app, trainable, fake_trainer, pump_until) -> None:
    trainer = fake_trainer(hold=True)
    app.runner.train_function = trainer
    app.model.replace(trainable)
    pump_until(app, lambda: not app.estimate.busy)  # the loop is measured beside training, not the estimate's start
    assert app.start()
    pump_until(app, lambda: trainer.control is not None)
    report = measure_latency(app, duration_s=0.5, interval_ms=10)
    trainer.release.set()
    pump_until(app, lambda: not app.footer.running)
    assert report.samples >= 5 and report.seconds >= 0.4  # it measured for the time asked (on a busy machine, longer)
    assert 0 <= report.p50_ms <= report.p95_ms <= report.max_ms
    assert "p50" in report.text()


def test_the_benchmark_runs_a_window_until_training_ends(display, tmp_path: Path, trainable_sd, fake_trainer) -> None:
    trainer = fake_trainer(epochs=1, steps_per_epoch=3)
    result = benchmark_gui_latency(tmp_path, max_seconds=600, train_function=trainer)
    assert result.outcome.startswith("Finished (completed)")
    assert result.latency.samples >= 1 and result.latency.seconds < 600  # ended with the run, not at max_seconds
