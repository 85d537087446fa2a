"""The memory and time estimate beside Start follows edits, and names a setting that helps when it does not fit."""

from __future__ import annotations

from onetrainer.training.estimate import GIB
from tests.gui.helpers import pump, view_of


def test_estimate_beside_start_follows_the_batch_size_and_advises(app) -> None:
    label = app.estimate
    assert label.master is app.footer.start_button.master  # in the row of Start
    pump(app, lambda: label.result is not None and label.cget("text").startswith("≈ "), timeout=60)
    assert label.cget("text").startswith(label.result.summary())  # "VRAM", or "CPU memory (RAM)" without a GPU
    before = label.result.peak_bytes

    batch = view_of(app, "training", "batch_size")
    batch.set_text("8")
    assert app.model.config.batch_size == 8
    pump(app, lambda: label.result is not None and label.result.peak_bytes > before, timeout=30)
    assert label.result.parts["activations"] > 0

    label.free_bytes = lambda device: 1 * GIB  # a small card
    label.schedule()
    pump(app, lambda: label.result is not None and label.result.fits is False and "try" in label.cget("text"))
    assert "> 1.0 GiB free" in label.cget("text")


def test_a_closed_window_cancels_its_running_estimate(app) -> None:
    """A measurement must not outlive its window: it would hold the model library that a sampling tool or the next
    window loads with."""
    import customtkinter as ctk

    from gui.widgets.estimate import EstimateLabel

    frame = ctk.CTkFrame(app)
    label = EstimateLabel(frame, app.model)
    label.refresh_now()
    cancel = label._cancel
    assert not cancel.is_set()
    frame.destroy()
    assert cancel.is_set()
    app.model.set("batch_size", 3)  # an edit after the close schedules nothing on the gone label
    pump(app, lambda: True)
