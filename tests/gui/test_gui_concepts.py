"""The concepts tab's cards and the concept window (forms, augmentation previews, statistics) in a real window."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import ImageChops, ImageOps

from gui.concept_preview import IMAGE_AUGMENT_MISSING, TEXT_AUGMENT_MISSING
from gui.preflight_view import PREFLIGHT_MISSING
from onetrainer.config import ConceptConfig
from onetrainer.data.images import list_images, open_rgb
from onetrainer.tiny.images import write_demo_images
from tests.gui.helpers import pump, settle

pytestmark = pytest.mark.gui


def _image_folder(tmp_path: Path, count: int = 4) -> Path:
    """Shapes with captions; the first image (and every third) has a mask."""
    folder = tmp_path / "shapes"
    folder.mkdir()
    return write_demo_images(folder, count=count, size=96, seed=3)


def _concepts_tab(app, concepts: list[ConceptConfig]):
    app.model.config.concepts = concepts
    app.model.replace(app.model.config)
    return app.select_tab("concepts")


def test_cards_show_edit_clone_and_remove_concepts(app, tmp_path: Path) -> None:
    folder = _image_folder(tmp_path)
    concept_file = Path(app.model.config.concept_file_name)
    concept_file.write_text(json.dumps([{"name": "shapes", "path": str(folder), "seed": 5}]), encoding="utf-8")
    app.model.config.concepts = None
    app.model.replace(app.model.config)
    tab = app.select_tab("concepts")
    assert [c.name for c in app.model.config.concepts] == ["shapes"]  # read from the concept file, now inline
    card = tab.cards[0]
    assert card.name_label.cget("text") == "shapes" and card.folder_label.cget("text").endswith("shapes")
    assert card.picture.cget("text") == ""  # the thumbnail of the first image is shown

    tab.add_button.invoke()
    assert len(app.model.config.concepts) == 2 and len(tab.cards) == 2
    assert tab.cards[1].picture.cget("text") == "no folder chosen"
    tab.cards[1].enabled.switch.toggle()
    assert app.model.config.concepts[1].enabled is False

    tab.cards[0].clone_button.invoke()
    names = [c.name for c in app.model.config.concepts]
    assert names == ["shapes", "shapes (copy)", ""]
    clone = app.model.config.concepts[1]
    assert clone.path == str(folder) and clone.seed == 5 and clone is not app.model.config.concepts[0]
    assert tab.cards[1].name_label.cget("text") == "shapes (copy)"

    tab.cards[0].remove_button.invoke()  # asked: "no" keeps it
    assert [c.name for c in app.model.config.concepts] == ["shapes", "shapes (copy)", ""]
    assert app.dialogs.asked[-1].startswith("yes/no: Delete concept: Delete the concept 'shapes'?")
    app.dialogs.answers.append(True)
    tab.cards[0].remove_button.invoke()
    assert [c.name for c in app.model.config.concepts] == ["shapes (copy)", ""]
    assert [c.name_label.cget("text") for c in tab.cards] == ["shapes (copy)", "(unnamed)"]


def test_the_concept_window_edits_and_previews_the_augmentation(app, tmp_path: Path, screenshot) -> None:
    folder = _image_folder(tmp_path)
    tab = _concepts_tab(app, [ConceptConfig(name="shapes", path=str(folder), seed=1)])
    window = tab.open(0)
    app.update()
    assert window.title() == "Concept: shapes"
    general = window.forms["general"]
    general.view("concepts.0.name").set_text("coloured shapes")
    assert app.model.config.concepts[0].name == "coloured shapes"
    assert tab.cards[0].name_label.cget("text") == "coloured shapes" and window.title() == "Concept: coloured shapes"
    general.view("concepts.0.balancing").set_text("2")
    assert app.model.config.concepts[0].balancing == 2.0
    screenshot(window, "concept-window-general")

    window.select("image")
    preview = window.image_preview
    pump(window, lambda: preview.last is not None)
    first = list_images(folder)[0]
    original = open_rgb(first)
    assert preview.last.image.size == original.size
    assert preview.last.mask is not None  # the first demo image has a mask
    assert "(1 / 4)" in preview.file_label.cget("text")
    if preview.last.note == IMAGE_AUGMENT_MISSING:
        pytest.skip("onetrainer.data.image_augment is not there yet")
    # Editing a setting redraws the preview: a fixed flip mirrors the image.
    window.forms["image"].view("concepts.0.image.enable_crop_jitter").switch.deselect()
    window.forms["image"].view("concepts.0.image.enable_fixed_flip").switch.toggle()
    assert app.model.config.concepts[0].image.enable_fixed_flip is True
    mirrored = ImageOps.mirror(original)
    pump(window, lambda: ImageChops.difference(preview.last.image, mirrored).getbbox() is None)
    preview.next_button.invoke()
    assert "(2 / 4)" in preview.file_label.cget("text")
    preview.previous_button.invoke()
    # A fixed rotation turns the image and its mask alike (the screenshot shows both).
    image_form = window.forms["image"]
    image_form.view("concepts.0.image.random_rotate_max_angle").set_text("20")
    image_form.view("concepts.0.image.enable_fixed_rotate").switch.toggle()
    pump(window, lambda: ImageChops.difference(preview.last.image, mirrored).getbbox() is not None)
    assert preview.last.mask.getpixel((2, 2)) == 0 and preview.last.mask.size == original.size
    settle(window, 0.2)
    screenshot(window, "concept-window-image")

    window.select("text")
    captions = window.caption_preview
    assert captions.captions == [(first.with_suffix(".txt")).read_text().strip()]
    if captions.note.cget("text") != TEXT_AUGMENT_MISSING:
        window.forms["text"].view("concepts.0.text.caps_randomize_enable").switch.toggle()
        window.forms["text"].view("concepts.0.text.caps_randomize_probability").set_text("1")
        window.forms["text"].view("concepts.0.text.caps_randomize_mode").set_text("capslock")
        pump(window, lambda: captions.variations and captions.variations[0] == captions.captions[0].upper())
    screenshot(window, "concept-window-text")

    window.select("video")  # how clips are cut into samples: a form generated from the concept's `video` node
    video = window.forms["video"]
    video.view("concepts.0.video.max_windows").set_text("3")
    modes = video.view("concepts.0.video.clip_mode")
    assert modes.menu.cget("values") == ["START", "EVEN", "RANDOM"]
    modes._chosen("EVEN")  # what choosing it in the menu calls
    assert app.model.config.concepts[0].video.max_windows == 3
    assert app.model.config.concepts[0].video.clip_mode == "EVEN"

    window.select("statistics")
    statistics = window.statistics
    pump(window, lambda: statistics.job is None, timeout=60)
    if statistics.statistics is None:
        assert statistics.status.cget("text") == PREFLIGHT_MISSING
    else:
        facts = dict(statistics.statistics.facts)
        assert facts["Images found"] == "4" and facts["Unreadable files"] == "0"
        rows = statistics.statistics.bucket_rows
        assert rows and statistics.chart.bar_count == len(rows)
        assert all(float(tick).is_integer() for tick in _y_ticks(statistics.chart))  # images are counted whole
    screenshot(window, "concept-window-statistics")

    # Removing a concept moves the others: the open window closes rather than edit the wrong one.
    app.dialogs.answers.append(True)
    tab.cards[0].remove_button.invoke()
    assert not window.winfo_exists()


def test_a_concept_without_images_says_so(app, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tab = _concepts_tab(app, [ConceptConfig(name="empty", path=str(tmp_path))])
    assert tab.cards[0].picture.cget("text") == "no images found"
    window = tab.open(0)
    window.select("image")
    assert window.image_preview.last is None
    assert "No images" in window.image_preview.note.cget("text")
    # Without the preflight module the statistics say so instead of failing.
    monkeypatch.setitem(sys.modules, "onetrainer.data.preflight", None)
    window.select("statistics")
    pump(window, lambda: window.statistics.job is None)
    assert window.statistics.status.cget("text") == PREFLIGHT_MISSING
    app.model.replace(app.model.config)  # another config: the window closes
    assert not window.winfo_exists()


def test_a_card_shows_what_trains_when_files_are_broken(app, tmp_path: Path) -> None:
    folder = _image_folder(tmp_path, count=2)
    broken = folder / "0-broken.png"  # listed first: before, the card took it for the thumbnail and said "no images"
    broken.write_bytes(b"\x89PNG\r\n\x1a\n cut off")
    tab = _concepts_tab(app, [ConceptConfig(name="shapes", path=str(folder))])
    card = tab.cards[0]
    assert card.picture.cget("text") == ""  # the first image that trains is shown
    assert card.found.image == list_images(folder)[1] and card.found.unreadable[0][0] == broken
    app.model.set("model_type", "QWEN_EDIT")  # an edit model trains only the images with reference images
    assert card.picture.cget("text") == "3 images, none usable"
    assert "no reference image beside them" in card._tooltip_text()

    app.model.set("model_type", "STABLE_DIFFUSION_15")
    all_broken = tmp_path / "all broken"
    all_broken.mkdir()
    shutil.copy(broken, all_broken / "a.png")
    (all_broken / "b.png").write_bytes(b"")
    app.model.set("concepts.0.path", str(all_broken))
    assert card.picture.cget("text") == "2 images, none readable"
    assert "a.png (" in card._tooltip_text() and "b.png (the file is empty)" in card._tooltip_text()
    # Start names the concept before anything loads.
    app.model.set("base_model_name", "tiny:sd15")
    assert app.start() is False
    assert f"concept 'shapes': none of the 2 images in {all_broken} can be trained" in app.dialogs.history[-1].text


@pytest.mark.skipif(shutil.which("xdotool") is None, reason="xdotool is not installed")
def test_a_click_on_a_card_opens_its_window(app, tmp_path: Path) -> None:
    tab = _concepts_tab(app, [ConceptConfig(name="first"), ConceptConfig(name="second", path=str(tmp_path))])
    app.lift()
    app.update()
    label = tab.cards[1].name_label
    x, y = label.winfo_rootx() + 10, label.winfo_rooty() + label.winfo_height() // 2
    subprocess.run(["xdotool", "mousemove", str(x), str(y), "click", "1"], check=True, timeout=10)
    pump(app, lambda: 1 in tab.windows)
    assert tab.windows[1].title() == "Concept: second"
    tab.windows[1].close()


def test_the_concept_window_shows_reference_images_and_counts_images_without_any(app, tmp_path: Path, screenshot):
    """An edit model's reference images (`<name>-reference[-N].<ext>`) show beside the image in the preview, and the
    statistics count the images with and without them; they are not images of their own."""
    folder = _image_folder(tmp_path, count=3)
    first, second, _ = list_images(folder)
    ImageOps.mirror(open_rgb(first)).save(folder / f"{first.stem}-reference.png")
    for number in (1, 2):
        open_rgb(second).resize((48, 64)).save(folder / f"{second.stem}-reference-{number}.jpg")
    tab = _concepts_tab(app, [ConceptConfig(name="edits", path=str(folder), seed=1)])
    window = tab.open(0)
    window.select("image")
    preview = window.image_preview
    pump(window, lambda: preview.last is not None)
    assert [p.name for p in preview.last.references] == [f"{first.stem}-reference.png"]
    assert preview.reference_caption.cget("text") == "reference image: 1 (first shown)"
    preview.next_button.invoke()
    pump(window, lambda: preview.last is not None and preview.last.references and len(preview.last.references) == 2)
    assert preview.reference_caption.cget("text") == "reference images: 2 (first shown)"
    screenshot(window, "concept-window-references")

    window.select("statistics")
    statistics = window.statistics
    pump(window, lambda: statistics.job is None, timeout=60)
    if statistics.statistics is None:
        assert statistics.status.cget("text") == PREFLIGHT_MISSING
    else:
        facts = dict(statistics.statistics.facts)
        assert facts["Images found"] == "3"
        assert facts["Images with reference images"] == "2" and facts["Images without any"] == "1"
    window.close()


def _y_ticks(chart) -> list[str]:
    return [chart.itemcget(item, "text") for item in chart.find_withtag("y-tick")]


def test_a_chart_of_counts_has_whole_ticks(app) -> None:
    """Two images in the largest bucket: the axis reads 0, 1, 2, not 0, 0.5, 1, 1.5, 2 (half images)."""
    from gui.widgets.bar_chart import BarChart

    chart = BarChart(app)
    try:
        chart.draw([2, 1], ["64x64", "64x96"], title="images per bucket")
        assert _y_ticks(chart) == ["0", "1", "2"]
        chart.draw([0.25, 0.5])  # a chart of fractions keeps its finer ticks
        assert _y_ticks(chart) == ["0", "0.1", "0.2", "0.3", "0.4", "0.5"]
    finally:
        chart.destroy()


def test_a_concepts_thumbnail_shows_in_a_second_window_of_the_process(app, tmp_path: Path) -> None:
    """The thumbnail cache keeps the decoded image, not a Tk picture of the first window's interpreter: the benchmark
    opens the app twice in one process, and the second concepts tab failed to show the demo's thumbnail."""
    import tkinter

    import customtkinter as ctk
    from PIL import Image

    from gui.widgets.concept_card import concept_thumbnail
    from gui.widgets.pictures import set_picture
    from onetrainer.config import ConceptConfig

    (tmp_path / "cats").mkdir()
    Image.new("RGB", (40, 30), "red").save(tmp_path / "cats" / "a.png")
    concept = ConceptConfig(name="cats", path=str(tmp_path / "cats"))
    # An earlier window shows it first (Tk pictures are made in the default root's interpreter: that window's then).
    first = ctk.CTk()
    shared_root, tkinter._default_root = tkinter._default_root, first
    try:
        set_picture(ctk.CTkLabel(first), concept_thumbnail(concept)[1])
    finally:
        tkinter._default_root = shared_root
        first.destroy()
    label = ctk.CTkLabel(app)
    try:
        set_picture(label, concept_thumbnail(concept)[1])  # raised TclError: image "pyimage…" doesn't exist
    finally:
        label.destroy()
