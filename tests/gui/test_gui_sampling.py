"""The sampling tab: sample rows with the full editor, clone, and the latest samples viewer."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from PIL import Image

from onetrainer.config.enums import NoiseScheduler
from onetrainer.training.events import SampleReady
from tests.gui.helpers import choose_in_menu

pytestmark = pytest.mark.gui


def test_the_sample_editor_shows_every_field_and_rows_clone(app) -> None:
    tab = app.select_tab("sampling")
    editor = tab.editor
    editor.add_button.invoke()
    editor.view(0, "prompt").set_text("a cat")
    editor.button(0, "…").invoke()
    window = tab.editor_window
    form = window.form
    assert form.view("samples.0.prompt").var.get() == "a cat"
    form.view("samples.0.negative_prompt").set_text("blurry")
    form.view("samples.0.prompt").set_text("a dog")
    choose_in_menu(form.view("samples.0.noise_scheduler").menu, "DDIM")
    sample = app.model.config.samples[0]
    assert (sample.prompt, sample.negative_prompt, sample.noise_scheduler) == ("a dog", "blurry", NoiseScheduler.DDIM)
    assert editor.view(0, "prompt").var.get() == "a dog"  # the row follows the editor
    # Fields that do not apply to this model type are not shown (SD 1.5 is no inpainting model).
    assert "samples.0.base_image_path" not in form.shown_paths()
    assert "samples.0.cfg_scale" in form.shown_paths()

    editor.button(0, "+").invoke()
    samples = app.model.config.samples
    assert [s.prompt for s in samples] == ["a dog", "a dog"] and samples[0] is not samples[1]
    assert not window.winfo_exists()  # the rows moved: the editor closed rather than edit another sample
    editor.button(1, "✕").invoke()
    assert len(app.model.config.samples) == 1


def _image(path: Path, color: str, age: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (64, 64), color).save(path)
    stamp = 1_700_000_000 + age
    os.utime(path, (stamp, stamp))
    return path


def test_the_latest_samples_come_from_events_and_the_workspace(app, tmp_path: Path, screenshot) -> None:
    workspace = tmp_path / "workspace"
    folder = workspace / "samples" / "0 - a red circle"
    _image(folder / "run-training-sample-6-1-0.jpg", "blue", 1)
    newest = _image(folder / "run-training-sample-12-2-0.jpg", "red", 2)
    app.model.config.workspace_dir = str(workspace)
    tab = app.select_tab("sampling")
    gallery = tab.gallery
    assert not gallery.tiles and gallery.empty_label.winfo_manager() == "grid"
    gallery.refresh_button.invoke()
    assert [image.path for image in app.gallery.images()] == [newest] and len(gallery.tiles) == 1

    other = _image(workspace / "samples" / "1 - a green square" / "run-training-sample-12-2-0.jpg", "green", 3)
    app._handle(SampleReady(12, 1, "a green square", str(other)))  # what the poll does with the trainer's event
    assert [image.index for image in app.gallery.images()] == [0, 1] and len(gallery.tiles) == 2
    assert "step 12" in gallery.tiles[1].winfo_children()[1].cget("text")

    screenshot(app, "tab-sampling-latest-samples")
    viewer = gallery.open(app.gallery.images()[0])
    assert viewer.history == [folder / "run-training-sample-6-1-0.jpg", newest] and viewer.position == 1
    viewer.move(-1)
    assert viewer.position == 0 and viewer.caption.cget("text").startswith("run-training-sample-6")
    screenshot(viewer, "sample-viewer")
    viewer.destroy()

    assert gallery.sample_now_button.cget("state") == "disabled"  # nothing runs: nothing to ask
    app.sample_now()
    assert "start it first" in app.footer.status


def test_another_presets_workspace_shows_none_of_the_demos_samples(app) -> None:
    """The latest samples are the loaded config's: after the demo trained, a preset with another workspace shows
    neither the demo's image nor its note; a sample in the new workspace stays."""
    gallery = app.select_tab("sampling").gallery
    assert app.load_preset("demo")
    demo = Path(app.model.config.workspace_dir).absolute() / "samples" / "0 - a red circle" / "demo-sample-3-1-0.jpg"
    app._handle(SampleReady(3, 0, "a red circle", str(demo)))
    kept = Path("workspace/run").absolute() / "samples" / "0 - a cat" / "run-sample-9-1-0.jpg"
    app._handle(SampleReady(9, 0, "a cat", str(kept)))
    assert len(gallery.tiles) == 2 and "random weights" in gallery.note_label.cget("text")

    assert app.load_preset("sd15/lora")
    assert Path(app.model.config.workspace_dir).absolute() == Path("workspace/run").absolute()
    assert [image.path for image in app.gallery.images()] == [kept] and len(gallery.tiles) == 1
    assert gallery.note_label.cget("text") == ""


def test_an_edit_models_sample_takes_reference_images_in_the_editor(app, tmp_path: Path) -> None:
    """The sample window of an edit model offers its reference images: typed as a list separated by ';' or added with
    the browse button; other model types do not show the field."""
    from onetrainer.config.enums import ModelType

    tab = app.select_tab("sampling")
    tab.editor.add_button.invoke()
    tab.editor.button(0, "…").invoke()
    assert "samples.0.reference_images" not in tab.editor_window.form.shown_paths()  # SD 1.5
    tab.editor_window.destroy()

    app.model.set("model_type", ModelType.QWEN_EDIT)
    tab = app.select_tab("sampling")
    tab.editor.button(0, "…").invoke()
    form = tab.editor_window.form
    assert "samples.0.reference_images" in form.shown_paths()
    view = form.view("samples.0.reference_images")
    app.validate_now()  # without one, each sample of the run would fail: marked before Start
    assert "Qwen-Image-Edit sample needs reference images" in view.error
    view.set_text(f"{tmp_path / 'a.png'}; {tmp_path / 'b.jpg'}")
    assert app.model.config.samples[0].reference_images == [str(tmp_path / "a.png"), str(tmp_path / "b.jpg")]
    app.validate_now()
    assert not view.error
    app.dialogs.answers.append(str(tmp_path / "c.webp"))
    view.browse()
    assert app.model.config.samples[0].reference_images[-1] == str(tmp_path / "c.webp")
    assert view.var.get().count("; ") == 2


def test_sample_pictures_are_decoded_off_the_tk_thread_and_a_sample_changes_its_own_tile(
    app, tmp_path: Path, monkeypatch, pump_until
) -> None:
    """A real model's samples are megapixel files: decoding them on the Tk thread, every tile again at every sample,
    held the window's input back. A worker decodes; a new sample changes its own tile only."""
    import threading

    import gui.widgets.pictures as pictures

    decoded_on: list[threading.Thread] = []
    open_rgb = pictures.open_rgb
    monkeypatch.setattr(
        pictures, "open_rgb", lambda path: decoded_on.append(threading.current_thread()) or open_rgb(path)
    )
    gallery = app.select_tab("sampling").gallery
    cat = _image(tmp_path / "samples" / "0 - a cat" / "run-training-sample-3-1-0.jpg", "red", 1)
    app._handle(SampleReady(3, 0, "a cat", str(cat)))
    tile = gallery.tiles[0]
    picture = tile.winfo_children()[0]
    pump_until(app, lambda: picture.cget("text") == "")  # "…" until the worker's picture is shown
    dog = _image(tmp_path / "samples" / "1 - a dog" / "run-training-sample-6-2-0.jpg", "blue", 2)
    app._handle(SampleReady(6, 1, "a dog", str(dog)))
    assert gallery.tiles[0] is tile and len(gallery.tiles) == 2
    pump_until(app, lambda: gallery.tiles[1].winfo_children()[0].cget("text") == "")
    assert len(decoded_on) == 2 and threading.main_thread() not in decoded_on
