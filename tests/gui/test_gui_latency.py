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
    # the loop is measured beside training, not the estimate's start (its first imports: long on a busy machine)
    pump_until(app, lambda: not app.estimate.busy, timeout=60)
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


THREE_TABS = ("general", "training", "backup")


def test_tabs_are_built_in_spare_time_a_few_fields_at_a_time(display, tmp_path: Path, monkeypatch, scripted_dialogs):
    """The window builds every tab while it waits for input, each piece creating at most BUILD_TABS_VIEWS fields, so
    input waits for one piece at most (a whole tab held clicks and keys back for seconds on a busy machine); a click on
    a tab not built yet shows its groups at once and leaves its fields to the next pieces, a later click only shows."""
    import gui.app as gui_app
    import gui.forms.form as form_module
    from gui.app import BUILD_TABS_VIEWS, App
    from onetrainer.config import TrainConfig
    from tests.gui.helpers import pump

    made: list[str] = []
    make_view = form_module.make_view

    def counting_make_view(parent, info, *args, **kwargs):
        made.append(info.path)
        return make_view(parent, info, *args, **kwargs)

    pieces: list[int] = []
    build_tabs = App._build_tabs

    def counting_build_tabs(self) -> None:
        before = len(made)
        build_tabs(self)
        pieces.append(len(made) - before)

    monkeypatch.setattr(form_module, "make_view", counting_make_view)
    monkeypatch.setattr(App, "_build_tabs", counting_build_tabs)
    # Three of the tabs (the first, the largest, a small one) keep the test short: each is built the same way.
    shown = gui_app.visible_tabs
    monkeypatch.setattr(gui_app, "visible_tabs", lambda ctx: [t for t in shown(ctx) if t.key in THREE_TABS])
    config = TrainConfig()
    config.concept_file_name = str(tmp_path / "concepts.json")
    config.sample_definition_file_name = str(tmp_path / "samples.json")
    app = App(config, dialogs=scripted_dialogs, autosave=False)
    try:
        assert app.tabview.current == "general" and app.tabs["general"].form.complete  # the first page opens whole
        before = len(made)
        app.tabview._clicked("training")  # as a click on the tab does
        training = app.tabs["training"]
        assert len(made) == before and training.form.groups and not training.form.complete

        def built() -> bool:
            return set(app.tabview.keys) <= set(app.tabs) and all(t.form.complete for t in app.tabs.values())

        pump(app, built, timeout=120)
        assert app.tabview.keys == ["general", "training", "backup"]
        assert pieces and max(pieces) <= BUILD_TABS_VIEWS
        assert "epochs" in made and "backup_after" in made  # the tab on screen and a tab never selected
        before = len(made)
        app.tabview._clicked("backup")
        assert len(made) == before and app.tabview.current == "backup"
    finally:
        app.destroy()
    # nothing of the closed window left to run (customtkinter's timers ran into destroyed widgets, and Tcl printed
    # "invalid command name …" while the benchmark's second window ran)
    assert not app.tk.splitlist(app.tk.call("after", "info"))


def test_start_and_background_jobs_leave_garbage_collection_to_python(app, trainable, monkeypatch) -> None:
    """A full collection on the Tk thread held the Start click (and every estimate's start) 0.1-0.6 s with a model
    library loaded; destroyed widgets' Tk objects reach the Tk thread without it (gui/tk_finalizers.py)."""
    import gc
    import threading

    from gui.background import run_in_background

    collected_on: list[str] = []
    collect = gc.collect
    monkeypatch.setattr(gc, "collect", lambda *a: collected_on.append(threading.current_thread().name) or collect(*a))
    app.model.replace(trainable)
    assert app.start()
    run_in_background(app, lambda: None, lambda _result: None)
    assert threading.main_thread().name not in collected_on
