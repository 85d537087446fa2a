"""Depth map files beside training images (`<stem>-depth.png`), for a model type with a depth input (SD 2.0 depth):
found with their image, never trained as images of their own, and moved exactly as the image is (scaled, cropped,
flipped); they key the latent cache."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from onetrainer.config import ConceptConfig, TrainConfig
from onetrainer.config.enums import ModelType
from onetrainer.data.buckets import Bucket
from onetrainer.data.images import depth_path_of, is_depth_map, list_images
from onetrainer.data.plan import PlannedSample
from onetrainer.data.samples import load_sample
from onetrainer.data.scan import scan_concept

DEPTH = ModelType.STABLE_DIFFUSION_20_DEPTH


def _blocks(size: tuple[int, int], seed: int) -> np.ndarray:
    """A picture of 8 px blocks of random grey levels: resizing by whole factors and cropping keep it exact."""
    rng = np.random.default_rng(seed)
    levels = rng.integers(0, 256, (size[1] // 8, size[0] // 8), dtype=np.uint8)
    return np.kron(levels, np.ones((8, 8), dtype=np.uint8))


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    grey = _blocks((96, 64), 1)
    Image.fromarray(np.stack([grey] * 3, axis=-1)).save(tmp_path / "room.png")
    Image.fromarray(grey).save(tmp_path / "room-depth.png")  # the depth map: the image's own grey levels
    Image.new("RGB", (64, 64), (10, 20, 30)).save(tmp_path / "street.jpg")
    Image.new("L", (64, 64), 128).save(tmp_path / "sea-depth.png")  # no `sea` image: an image like any other
    return tmp_path


def test_depth_files_are_found_and_are_no_training_images(folder: Path):
    assert [p.name for p in list_images(folder)] == ["room.png", "sea-depth.png", "street.jpg"]
    assert is_depth_map(folder / "room-depth.png") and not is_depth_map(folder / "sea-depth.png")
    scan = scan_concept(0, ConceptConfig(name="c", path=str(folder)), folder, masked=False)
    depths = {e.path.name: e.depth for e in scan.images}
    assert depths == {"room.png": depth_path_of(folder / "room.png"), "sea-depth.png": None, "street.jpg": None}


def _concept(folder: Path, seed: int = 0, **image_settings) -> ConceptConfig:
    concept = ConceptConfig(name="c", path=str(folder), seed=seed)
    for name, value in image_settings.items():
        setattr(concept.image, name, value)
    return concept


@pytest.mark.parametrize("variation", range(4))
def test_the_depth_map_moves_exactly_as_its_image(folder: Path, variation: int):
    concept = _concept(folder, seed=variation, enable_crop_jitter=True, enable_random_flip=True)
    scan = scan_concept(0, concept, folder, masked=False)
    entry = next(e for e in scan.images if e.path.name == "room.png")
    planned = PlannedSample(0, Bucket(48, 32), variation)  # 96x64 -> 48x32: half, then no crop; or jitter
    sample = load_sample(entry, planned, concept, with_mask=False, with_depth=True)
    assert sample.depth is not None and sample.depth.shape == (1, 32, 48)
    grey = (sample.pixels[0] + 1) * 127.5  # the image's grey levels, as the file's
    # (the image in 8 bits, PIL resampling it in fixed point and clipping the overshoot; the depth map in float)
    assert torch.allclose(sample.depth[0].clamp(0, 255), grey, atol=1.5)
    assert load_sample(entry, planned, concept, with_mask=False).depth is None  # only where asked


def test_flipped_and_cropped_with_the_image(folder: Path):
    flipped = _concept(folder, enable_fixed_flip=True)
    entry = next(e for e in scan_concept(0, flipped, folder, masked=False).images if e.path.name == "room.png")
    planned = PlannedSample(0, Bucket(64, 64), 0)  # 96x64 covers 64x64 unscaled: only cropped
    sample = load_sample(entry, planned, flipped, with_mask=False, with_depth=True)
    assert torch.allclose(sample.depth[0], (sample.pixels[0] + 1) * 127.5, atol=1e-3)  # no resampling: exact
    plain = load_sample(entry, planned, _concept(folder), with_mask=False, with_depth=True)
    assert torch.equal(sample.depth, plain.depth.flip(-1))  # the same crop, mirrored
    rows = _blocks((96, 64), 1).astype(np.float32)
    assert any(torch.equal(plain.depth[0], torch.from_numpy(rows[:, left : left + 64])) for left in range(33))


def test_the_depth_file_keys_the_latent_cache(folder: Path):
    from onetrainer.data.training_data import TrainingData

    concept = ConceptConfig(name="c", path=str(folder))
    config = TrainConfig(concepts=[concept], resolution="64", batch_size=1, model_type=DEPTH)
    data = TrainingData(config, 8)
    room = next(i for i, e in enumerate(data.images) if e.path.name == "room.png")
    planned = PlannedSample(room, Bucket(64, 64), 0)
    before = data._latent_key(planned, False)
    Image.fromarray(_blocks((96, 64), 2)).save(folder / "room-depth.png")  # another depth map: another entry
    assert data._latent_key(planned, False) != before
    plain = TrainingData(TrainConfig(concepts=[concept], resolution="64", batch_size=1), 8)
    assert not plain.with_depth and data.with_depth


def test_mask_driven_crops_and_rotation_move_the_depth_map_too(folder: Path):
    """Masked training's rotate-and-crop and circular shrink, and a random rotation: the depth map takes the same."""
    mask = np.zeros((64, 96), dtype=np.uint8)
    mask[16:48, 40:72] = 255
    Image.fromarray(mask).save(folder / "room-masklabel.png")
    settings = {"enable_random_mask_rotate_crop": True, "enable_random_circular_mask_shrink": True}
    concept = _concept(folder, seed=4, enable_random_rotate=True, random_rotate_max_angle=15.0, **settings)
    entry = next(e for e in scan_concept(0, concept, folder, masked=True).images if e.path.name == "room.png")
    loaded = [load_sample(entry, PlannedSample(0, Bucket(32, 32), v), concept, True, with_depth=True) for v in range(3)]
    greys = [(sample.pixels[0] + 1) * 127.5 for sample in loaded]
    for sample, grey in zip(loaded, greys):
        # bilinear rotation and bicubic scaling on 8-bit pixels against a float map: close, not bit-equal
        assert (sample.depth[0].clamp(0, 255) - grey).abs().mean() < 1.0
    # another variation's crop and turn is far off: the closeness above is the same moves, not a blur
    assert (loaded[0].depth[0].clamp(0, 255) - greys[1]).abs().mean() > 10.0


def test_the_preflight_report_counts_the_depth_files(folder: Path):
    from onetrainer.data.preflight import preflight_report

    concept = ConceptConfig(name="c", path=str(folder))
    depth = TrainConfig(concepts=[concept], resolution="64", batch_size=1, model_type=DEPTH)
    report = preflight_report(depth)
    assert report.concepts[0].with_depth == 1
    assert "depth maps: 1 from -depth.png files, 2 by the model's depth estimator" in report.text()
    plain = preflight_report(TrainConfig(concepts=[concept], resolution="64", batch_size=1))
    assert plain.concepts[0].with_depth is None and "depth maps" not in plain.text()
    from gui.preflight_view import concept_statistics

    facts = dict(concept_statistics(report, 0).facts)
    assert facts["Images with a depth map file"] == "1" and facts["Depth maps to estimate"] == "2"
    assert "Images with a depth map file" not in dict(concept_statistics(plain, 0).facts)
