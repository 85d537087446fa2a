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
