"""Reference images beside training images (`<stem>-reference.<ext>`, `<stem>-reference-N.<ext>`): found in order,
never trained as images of their own, and, for a model type that learns from them, an image without one is skipped
and named in the scan, the preflight report and the trainer's warnings."""

from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image

from onetrainer.config import ConceptConfig, TrainConfig
from onetrainer.data import scan as scan_module
from onetrainer.data.images import is_reference_image, list_images, reference_paths_of
from onetrainer.data.preflight import preflight_report
from onetrainer.data.scan import scan_concept


def _image(path: Path, size: tuple[int, int] = (64, 48)) -> Path:
    Image.new("RGB", size, (200, 40, 40)).save(path)
    return path


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    for name in ("cat.png", "cat-reference.jpg", "dog.jpg", "dog-reference-2.png", "dog-reference-10.png",
                 "dog-reference-1.webp", "bird.png", "lonely-reference.png", "wolf.png", "wolf-reference.png",
                 "wolf-reference-1.png"):  # fmt: skip
        _image(tmp_path / name, (32, 32) if "reference" in name else (64, 48))
    (tmp_path / "cat.txt").write_text("a cat", encoding="utf-8")
    return tmp_path


def test_references_are_found_in_order_and_are_no_training_images(folder: Path):
    assert [p.name for p in list_images(folder)] == ["bird.png", "cat.png", "dog.jpg", "lonely-reference.png",
                                                      "wolf.png"]  # fmt: skip
    assert [p.name for p in reference_paths_of(folder / "cat.png")] == ["cat-reference.jpg"]
    assert [p.name for p in reference_paths_of(folder / "dog.jpg")] == [
        "dog-reference-1.webp", "dog-reference-2.png", "dog-reference-10.png",
    ]  # fmt: skip
    # the one `-reference` file where there is one; nothing for an image without any
    assert [p.name for p in reference_paths_of(folder / "wolf.png")] == ["wolf-reference.png"]
    assert reference_paths_of(folder / "bird.png") == ()
    # a `-reference` file without its image is an image like any other
    assert not is_reference_image(folder / "lonely-reference.png") and is_reference_image(folder / "cat-reference.jpg")


def test_a_model_type_that_learns_from_references_skips_and_names_images_without_one(folder: Path, monkeypatch):
    concept = ConceptConfig(name="edits", path=str(folder))
    ignored = scan_concept(0, concept, folder, masked=False)
    assert len(ignored.images) == 5 and not ignored.missing_references
    assert {e.path.name: len(e.references) for e in ignored.images} == {
        "bird.png": 0, "cat.png": 1, "dog.jpg": 3, "lonely-reference.png": 0, "wolf.png": 1,
    }  # fmt: skip

    edits = scan_concept(0, concept, folder, masked=False, references=True)
    assert [e.path.name for e in edits.images] == ["cat.png", "dog.jpg", "wolf.png"]
    assert [p.name for p in edits.missing_references] == ["bird.png", "lonely-reference.png"]

    monkeypatch.setattr(scan_module, "reference_rule", lambda config: scan_module.ReferenceRule())
    config = TrainConfig(concepts=[concept], resolution="64", batch_size=1)
    report = preflight_report(config)
    (entry,) = report.concepts
    assert entry.images == 3 and [Path(p).name for p in entry.missing_references] == [
        "bird.png",
        "lonely-reference.png",
    ]
    assert "reference images missing (skipped): 2: bird.png, lonely-reference.png" in report.text()


def test_a_model_that_also_generates_trains_images_without_references_and_skips_those_with_too_many(
    folder: Path, monkeypatch
):
    """Kontext's rule: references optional, at most one. An image without one trains as plain text to image; one with
    more is named and skipped, in the scan, the first-usable search, the preflight report and the trainer's warnings."""
    from onetrainer.config.enums import ModelType
    from onetrainer.data.scan import ReferenceRule, first_usable_image, reference_rule

    rule = reference_rule(TrainConfig(model_type=ModelType.FLUX_KONTEXT_DEV_1))
    assert rule == ReferenceRule(required=False, most=1, label="Flux.1 Kontext Dev")
    concept = ConceptConfig(name="edits", path=str(folder))
    scan = scan_concept(0, concept, folder, masked=False, references=rule)
    assert [e.path.name for e in scan.images] == ["bird.png", "cat.png", "lonely-reference.png", "wolf.png"]
    assert [(p.name, n) for p, n in scan.too_many_references] == [("dog.jpg", 3)] and not scan.missing_references
    assert rule.why_skipped(3) == "3 reference images (Flux.1 Kontext Dev takes one)" and rule.why_skipped(0) == ""

    only_dog = folder / "only-dog"
    only_dog.mkdir()
    for name in ("dog.png", "dog-reference-1.png", "dog-reference-2.png"):
        _image(only_dog / name)
    found = first_usable_image(only_dog, references=rule)
    assert found.image is None and [(p.name, n) for p, n in found.too_many_references] == [("dog.png", 2)]
    assert "1 has more reference images than this model type takes: dog.png (2)" in found.reason()

    config = TrainConfig(model_type=ModelType.FLUX_KONTEXT_DEV_1, concepts=[concept], resolution="64", batch_size=1)
    report = preflight_report(config)
    assert "more reference images than the model takes (skipped): 1: dog.jpg" in report.text()


def test_a_batch_holds_images_with_as_many_references_each(folder: Path):
    """Images with and without a reference share a bucket here; each batch holds one kind, so references stack."""
    from onetrainer.config.enums import ModelType
    from onetrainer.data.plan import plan_epoch
    from onetrainer.data.scan import reference_rule

    config = TrainConfig(model_type=ModelType.FLUX_KONTEXT_DEV_1, resolution="64", batch_size=2)
    images = scan_concept(0, ConceptConfig(path=str(folder)), folder, False, reference_rule(config)).images
    config.concepts = [ConceptConfig(path=str(folder))]
    plan = plan_epoch(images, config, epoch=0, step=16, seed=1)
    kinds = [{len(images[s.image].references) for s in batch} for batch in plan.batches]
    # bird (none) and cat, wolf (one each) share the 80x48 bucket: two batches there; lonely-reference.png is square
    assert all(len(kind) == 1 for kind in kinds) and sorted(k for (k,) in kinds) == [0, 0, 1]


def test_only_a_family_that_declares_references_learns_from_them(unbuilt_model_type):
    from onetrainer.config.enums import ModelType
    from onetrainer.config.model_types import MODEL_TYPES

    learning = {info.model_type for info in MODEL_TYPES.values() if info.family.reference_images}
    assert learning == {ModelType.QWEN_EDIT, ModelType.FLUX_KONTEXT_DEV_1, ModelType.FLUX_2}
    assert scan_module.trains_on_references(TrainConfig(model_type=ModelType.QWEN_EDIT))
    assert not scan_module.trains_on_references(TrainConfig(model_type=ModelType.QWEN))
    assert not scan_module.trains_on_references(TrainConfig(model_type=unbuilt_model_type))  # not trainable
    # Qwen2.5-VL reads the pictures with the instruction; Kontext's and Flux.2's text encoders read the caption alone
    reading = {t for t in learning if scan_module.text_reads_references(TrainConfig(model_type=t))}
    assert reading == {ModelType.QWEN_EDIT}


def _halves(path: Path, size: tuple[int, int]) -> Path:
    """Red on the left half, blue on the right."""
    image = Image.new("RGB", size, (0, 0, 255))
    image.paste((255, 0, 0), (0, 0, size[0] // 2, size[1]))
    image.save(path)
    return path


def _edit_image(folder: Path, sizes: list[tuple[int, int]], seed: int, **image_settings):
    """`edit.png` of the first size with `edit-reference-N.png` of the others (each red left, blue right), a concept
    of the folder with these image settings, and the scanned image; (concept, entry)."""
    _halves(folder / "edit.png", sizes[0])
    for n, size in enumerate(sizes[1:], start=1):
        _halves(folder / f"edit-reference-{n}.png", size)
    concept = ConceptConfig(name="edits", path=str(folder), seed=seed)
    for name, value in image_settings.items():
        setattr(concept.image, name, value)
    (entry,) = scan_concept(0, concept, folder, masked=False, references=True).images
    return concept, entry


def test_references_are_cropped_and_flipped_as_their_image(tmp_path: Path, monkeypatch):
    """The image's crop (as a share of each reference's own size) and its flip apply to its references; a batch of a
    family that learns from them carries them, decoded with the images."""
    from onetrainer.data import training_data
    from onetrainer.data.buckets import Bucket
    from onetrainer.data.plan import PlannedSample
    from onetrainer.data.samples import load_sample

    concept, entry = _edit_image(
        tmp_path, [(64, 48), (32, 24), (40, 16)], seed=3, enable_crop_jitter=False, enable_fixed_flip=True
    )
    sample = load_sample(entry, PlannedSample(0, Bucket(48, 48), 0), concept, with_mask=False, with_references=True)
    assert sample.pixels.shape == (3, 48, 48)
    # 64 -> 48 wide: an eighth cut on each side, of every reference too
    assert [tuple(r.shape) for r in sample.references] == [(3, 24, 24), (3, 16, 30)]
    for tensor in (sample.pixels, *sample.references):  # flipped: blue (the right half) now on the left
        assert tensor[2, :, 0].min() > 0.9 and tensor[0, :, -1].min() > 0.9
    assert load_sample(entry, PlannedSample(0, Bucket(48, 48), 0), concept, with_mask=False).references == []

    monkeypatch.setattr(training_data, "trains_on_references", lambda config: True)
    data = training_data.TrainingData(TrainConfig(concepts=[concept], resolution="64", batch_size=1), 16)
    (step,) = data.step_batches(0, 0)
    batch = data.load_batch(step, 0, with_masks=False)
    assert batch.references is not None and [len(r) for r in batch.references] == [2]
    assert all(r.shape[0] == 3 and r[2, :, 0].min() > 0.9 for r in batch.references[0])  # flipped with the image


def test_references_alone_are_those_loaded_with_the_image_and_the_image_is_not_decoded(tmp_path: Path, monkeypatch):
    """A step that reads the references with the caption (the image's latents cached) loads them alone: the same
    crop, flip and rotation as with the image, for every variation, and the image file is never opened."""
    from onetrainer.data import samples
    from onetrainer.data.buckets import Bucket
    from onetrainer.data.plan import PlannedSample

    jitter_flip_rotate = {"enable_crop_jitter": True, "enable_random_flip": True, "enable_random_rotate": True}
    concept, entry = _edit_image(
        tmp_path, [(80, 48), (40, 30), (64, 64)], seed=5, random_rotate_max_angle=20.0, **jitter_flip_rotate
    )
    flips = set()
    for variation in range(6):
        planned = PlannedSample(0, Bucket(48, 40), variation)
        full = samples.load_sample(entry, planned, concept, with_mask=False, with_references=True).references
        alone = samples.load_references(entry, planned, concept)
        assert len(alone) == 2 and all(a.equal(b) for a, b in zip(alone, full))
        flips.add(bool(full[0][2, :, 0].mean() > 0))  # blue on the left: flipped
    assert flips == {True, False}  # the draws differ between variations, and the references follow them

    opened = []
    real_open = samples.open_rgb
    monkeypatch.setattr(samples, "open_rgb", lambda path: opened.append(Path(path).name) or real_open(path))
    samples.load_references(entry, PlannedSample(0, Bucket(48, 40), 1), concept)
    assert opened == ["edit-reference-1.png", "edit-reference-2.png"]


def test_the_readme_names_the_files_beside_an_image_as_they_are_found(tmp_path: Path):
    """The README's names for the caption, mask and reference files are the ones the scan finds (its example too)."""
    from onetrainer.data.images import MASK_SUFFIX, REFERENCE_SUFFIX, mask_path_of
    from tests.conftest import ROOT

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for name in ("<image>.txt", f"<image>{MASK_SUFFIX}.png", f"<image>{REFERENCE_SUFFIX}.<ext>",
                 f"<image>{REFERENCE_SUFFIX}-1.<ext>", f"<image>{REFERENCE_SUFFIX}-2.<ext>"):  # fmt: skip
        assert f"`{name}`" in readme, name
    assert "`photo.jpg` with `photo-reference.png`" in readme
    photo, reference = _image(tmp_path / "photo.jpg"), _image(tmp_path / "photo-reference.png")
    assert reference_paths_of(photo) == (reference,) and list_images(tmp_path) == [photo]
    assert mask_path_of(photo).name == "photo-masklabel.png"
