"""The memory and time estimate beside Start follows edits, and names a setting that helps when it does not fit."""

from __future__ import annotations

from onetrainer.config.enums import DataType, ModelFormat, ModelType, TrainingMethod
from onetrainer.training.estimate import GIB, Estimate
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


def test_a_click_on_the_estimate_fits_the_run_to_a_vram_budget(app, screenshot) -> None:
    config = app.model.config.copy()
    config.model_type = ModelType.FLUX_DEV_1
    config.training_method = TrainingMethod.LORA
    config.output_model_format = ModelFormat.KOHYA_LORA
    config.base_model_name = "black-forest-labs/FLUX.1-dev"  # counted as the released model: nothing is downloaded
    config.resolution = "512"
    config.batch_size = 2
    config.transformer.weight_dtype = DataType.FLOAT_8
    config.text_encoder.train = config.text_encoder_2.train = False
    app.model.replace(config)
    app.dialogs.answers.append("9 GiB")
    app.estimate._label.event_generate("<Button-1>")
    assert app.dialogs.asked[-1].startswith("text: Fit to VRAM: Fit the run to how many GiB")
    pump(app, lambda: app.footer.status.startswith("fitted to 9.0 GiB"), timeout=120)
    fitted = app.model.config
    assert fitted.optimizer.optimizer.value == "ADAMW_8BIT" and 0 < fitted.transformer.offload_fraction <= 0.9
    view = view_of(app, "training", "transformer.offload_fraction")  # an ordinary setting, shown where it lives
    assert float(view.var.get()) == fitted.transformer.offload_fraction
    assert "Fit to VRAM: fitted to 9.0 GiB" in app.log.text
    screenshot(app, "estimate-fitted-to-9-gib")

    app.dialogs.answers.append("a lot")
    assert app.fit_to_vram() is False and "is not a size in GiB" in app.dialogs.history[-1].text

    # One estimate: the fit starts from the figure shown beside Start (where it is of a GPU), rounded as it is there.
    pump(app, lambda: not app.estimate.busy, timeout=120)
    app.estimate.result = Estimate(5 * GIB, None, device="cuda", host_bytes=9 * GIB)
    assert app.fit_to_vram(8)
    pump(app, lambda: app.footer.status.startswith("fits 8.0 GiB VRAM as it is (≈ 5.0 GiB VRAM, 9.0 GiB RAM)"))


def test_a_loaded_preset_replaces_the_previous_figure_at_once(app) -> None:
    """The figure beside Start is the loaded preset's, or none: never the previous preset's while the new one is
    estimated, and the new estimate starts without waiting for more edits."""
    import json

    from gui.state import user_preset_path
    from gui.widgets.estimate import ESTIMATING
    from tests.helpers import PRESETS_DIR

    label = app.estimate
    assert app.load_preset("demo")
    pump(app, lambda: label.result is not None and not label.busy, timeout=60)
    demo = label.result
    bigger = json.loads((PRESETS_DIR / "demo.json").read_text(encoding="utf-8")) | {"batch_size": 8}
    path = user_preset_path("demo-batch-8")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(bigger), encoding="utf-8")

    assert app.load_preset("demo-batch-8", user=True)
    assert label.cget("text") == ESTIMATING and label.result is None  # not the demo's figure
    app.update()  # the window's next turn: the new config's estimate is running (no 0.7 s wait for more edits)
    assert label._job is not None and not label._job.cancelled and label._pending is None
    pump(app, lambda: label.result is not None, timeout=60)
    assert label.result.parts["activations"] == 4 * demo.parts["activations"]  # batch 8, not 2
    assert label.cget("text").startswith(label.result.summary())
