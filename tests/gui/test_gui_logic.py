"""The GUI's logic without a window: concept previews, mask editing, the sample gallery, the statistics view."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from PIL import Image

from gui.concept_preview import (
    IMAGE_AUGMENT_MISSING,
    TEXT_AUGMENT_MISSING,
    augmented_captions,
    augmented_image,
    captions_of,
    concept_images,
    first_image,
)
from gui.forms.selection import node_fields
from gui.gallery import SampleGallery, scan_samples
from gui.mask_editing import IGNORE, TRAIN, MaskDocument
from gui.preflight_view import concept_statistics
from gui.tabs.additional_embeddings import clone_embedding, unique_placeholder
from onetrainer.config import ConceptConfig
from onetrainer.config.embedding_config import TrainEmbeddingConfig
from onetrainer.data.images import mask_path_of, open_mask
from onetrainer.training.events import SampleReady


def _image(path: Path, size: tuple[int, int] = (40, 30), color: str = "red") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, color).save(path)
    return path


# -- concept previews ------------------------------------------------------------------------------------------------


def test_concept_images_and_captions_follow_the_prompt_source(tmp_path: Path) -> None:
    first = _image(tmp_path / "a.png")
    _image(tmp_path / "b.jpg")
    _image(tmp_path / "a-masklabel.png")  # a mask is not a training image
    first.with_suffix(".txt").write_text("line one\n\nline two\n", encoding="utf-8")
    concept = ConceptConfig(path=str(tmp_path))
    assert [p.name for p in concept_images(concept)] == ["a.png", "b.jpg"] and first_image(concept).image == first
    assert captions_of(first, concept) == ["line one", "line two"]
    assert captions_of(tmp_path / "b.jpg", concept) == []
    concept.text.prompt_source = "filename"
    assert captions_of(first, concept) == ["a"]
    concept.text.prompt_source = "concept"
    concept.text.prompt_path = str(tmp_path / "all.txt")
    (tmp_path / "all.txt").write_text("x\ny\n", encoding="utf-8")
    assert captions_of(first, concept) == ["x", "y"]
    assert concept_images(ConceptConfig(path=str(tmp_path / "missing"))) == []
    assert first_image(ConceptConfig(path="")) is None
    assert [p.name for p in concept_images(ConceptConfig(path="tiny:images"))][:1] == ["00-black-circle.png"]


def test_augmented_image_brings_its_mask_at_the_image_size(tmp_path: Path) -> None:
    image = _image(tmp_path / "a.png", (40, 30))
    Image.new("L", (20, 15), 255).save(mask_path_of(image))  # another size: scaled like training does
    concept = ConceptConfig(path=str(tmp_path))
    result = augmented_image(image, concept, seed=1)
    assert result.image.size == (40, 30) and result.mask is not None and result.mask.size == (40, 30)
    assert augmented_image(_image(tmp_path / "b.png"), concept, seed=1).mask is None


def test_previews_say_when_the_augmentation_is_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "onetrainer.data.image_augment", None)  # import raises ImportError
    monkeypatch.setitem(sys.modules, "onetrainer.data.text_augment", None)
    image = _image(tmp_path / "a.png")
    concept = ConceptConfig(path=str(tmp_path))
    result = augmented_image(image, concept, seed=1)
    assert result.note == IMAGE_AUGMENT_MISSING and result.image.size == (40, 30)
    assert augmented_captions(["a cat"], concept, seed=1) == ([], TEXT_AUGMENT_MISSING)


def test_augmented_captions_draw_from_the_lines() -> None:
    concept = ConceptConfig()
    lines, note = augmented_captions(["one", "two"], concept, seed=3, count=6)
    assert note == "" and len(lines) == 6 and set(lines) <= {"one", "two"}
    assert augmented_captions([], concept, seed=3) == ([], "")


def test_node_fields_give_a_concepts_fields_at_its_path() -> None:
    concept = ConceptConfig()
    general = [f.path for f in node_fields(concept, "concepts.2")]
    assert general[:2] == ["concepts.2.name", "concepts.2.path"] and "concepts.2.concept_stats" not in general
    assert not any(p.startswith("concepts.2.image.") for p in general)
    image = [f.path for f in node_fields(concept, "concepts.2", "image")]
    assert "concepts.2.image.enable_random_flip" in image and all(p.startswith("concepts.2.image.") for p in image)


# -- mask editing ----------------------------------------------------------------------------------------------------


def test_mask_strokes_fill_undo_and_save(tmp_path: Path) -> None:
    image = _image(tmp_path / "a.png", (100, 60))
    doc = MaskDocument(image)
    assert not doc.has_mask and doc.composite((50, 30)).size == (50, 30)
    doc.stroke_start(10, 30, 3, TRAIN)
    doc.stroke_to(90, 30, 3, TRAIN)
    doc.stroke_end()
    assert doc.mask.getpixel((50, 30)) == TRAIN and doc.mask.getpixel((50, 5)) == IGNORE
    saved = doc.save()
    assert saved == mask_path_of(image) and open_mask(saved).getpixel((50, 30)) == TRAIN
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]  # written atomically

    doc.fill(50, 5, TRAIN)  # the stroke does not reach the edges: the black around it is one region
    assert doc.mask.getpixel((50, 55)) == TRAIN
    assert doc.undo() and doc.mask.getpixel((50, 55)) == IGNORE
    doc.fill(500, 500, TRAIN)  # outside the image: nothing happens, nothing to undo
    assert len(doc.undo_stack) == 1
    assert doc.undo() and not doc.has_mask and not doc.undo()
    assert doc.save() is None and not saved.exists()  # back to no mask: the file goes

    doc.stroke_start(50, 30, 5, TRAIN)
    dimmed = doc.composite((100, 60))
    assert dimmed.getpixel((50, 30)) == (255, 0, 0) and dimmed.getpixel((5, 5))[0] < 128
    assert doc.composite((100, 60), mask_only=True).getpixel((5, 5)) == (0, 0, 0)


def test_a_mask_of_another_size_is_scaled_to_the_image(tmp_path: Path) -> None:
    image = _image(tmp_path / "a.png", (100, 60))
    Image.new("L", (50, 30), 255).save(mask_path_of(image))
    doc = MaskDocument(image)
    assert doc.has_mask and doc.mask.size == (100, 60)


# -- the sample gallery ----------------------------------------------------------------------------------------------


def test_the_gallery_keeps_the_newest_image_per_sample(tmp_path: Path) -> None:
    root = tmp_path / "samples"
    old = _image(root / "0 - a cat" / "1.jpg")
    new = _image(root / "0 - a cat" / "2.jpg")
    os.utime(old, (1, 1))
    _image(root / "1 - a dog - no-ema" / "1.jpg")
    _image(root / "not a sample folder" / "1.jpg")
    found = scan_samples(tmp_path)
    assert sorted(found) == ["0 - a cat", "1 - a dog - no-ema"] and found["0 - a cat"].path == new
    gallery = SampleGallery()
    heard: list[int] = []
    gallery.subscribe(lambda: heard.append(len(gallery.latest)))
    gallery.scan(tmp_path)
    newer = _image(root / "0 - a cat" / "3.jpg")
    gallery.add(SampleReady(30, 0, "a cat", str(newer)))
    assert [(s.index, s.path.name, s.step) for s in gallery.images()] == [(0, "3.jpg", 30), (1, "1.jpg", None)]
    named = _image(root / "2 - a bird" / "run-training-sample-12-2-0.jpg")
    assert scan_samples(tmp_path)["2 - a bird"].step == 12 and named.is_file()
    assert heard == [2, 2]
    assert scan_samples(tmp_path / "nowhere") == {}


# -- the statistics view ---------------------------------------------------------------------------------------------


def test_statistics_come_from_the_preflight_report() -> None:
    preflight = pytest.importorskip("onetrainer.data.preflight")
    row = preflight.BucketRow("512x512", 4, 2, 1, 0)
    entry = preflight.ConceptReport(
        1, "cats", "/data/cats", True, 4, missing_captions=["/data/cats/a.png"], buckets=[row],
        warnings=["/data/cats/dot.png is only 1x1 pixels"],
    )  # concept 0 is disabled: the report skips it  # fmt: skip
    report = preflight.PreflightReport([entry], steps_per_epoch=2, total_steps=200, errors=["something odd"])
    stats = concept_statistics(report, 1)
    facts = dict(stats.facts)
    assert facts["Images found"] == "4" and facts["Captions missing"] == "1"
    assert facts["Total steps (all concepts)"] == "200"
    assert stats.bucket_rows == [["512x512", "4", "2", "1", "0"]] and stats.bucket_images == [4.0]
    assert any("a.png" in note for note in stats.notes) and "Error: something odd" in stats.notes
    assert "Warning: /data/cats/dot.png is only 1x1 pixels" in stats.notes  # tiny images, huge captions
    assert concept_statistics(report, 0).notes[0].startswith("This concept is not in the report")


# -- additional embeddings -------------------------------------------------------------------------------------------


def test_embedding_rows_get_their_own_placeholder_and_uuid() -> None:
    assert unique_placeholder(set()) == "<embedding-1>"
    assert unique_placeholder({"<embedding-1>", "<embedding-2>"}) == "<embedding-3>"
    original = TrainEmbeddingConfig(placeholder="<cat>")
    clone = clone_embedding(original)
    assert clone.placeholder == "<cat>" and clone.uuid != original.uuid and clone is not original


def test_axis_ticks_are_round() -> None:
    from gui.widgets.bar_chart import nice_ticks

    assert nice_ticks(3240) == [0, 1000, 2000, 3000, 4000]
    assert nice_ticks(1000) == [0, 200, 400, 600, 800, 1000]
    assert nice_ticks(0.37) == [0, 0.1, 0.2, 0.3, 0.4]
    assert nice_ticks(7) == [0, 2, 4, 6, 8]
    assert nice_ticks(0) == [0, 1]
    # an axis of counts (images per bucket) has no half images: 2 images are 0, 1, 2, not 0, 0.5, 1, 1.5, 2
    assert nice_ticks(2, whole=True) == [0, 1, 2] and nice_ticks(1, whole=True) == [0, 1]
    assert nice_ticks(7, whole=True) == [0, 2, 4, 6, 8]


def test_axis_labels_stay_short() -> None:
    from gui.widgets.bar_chart import format_count

    assert [format_count(v) for v in (0, 4, 0.5, 3239.5, 6479, 25_000)] == ["0", "4", "0.5", "3240", "6479", "25k"]
