"""The minimal loader: captions, masks, order and the keep-every-image batching."""

from __future__ import annotations

from collections import Counter

import pytest
from PIL import Image

from onetrainer.config import config_from_dict
from onetrainer.data.dataset import DatasetError, TrainingDataset


def folder_with(tmp_path, count: int, captions: dict[str, str] | None = None):
    folder = tmp_path / "imgs"
    folder.mkdir()
    for i in range(count):
        Image.new("RGB", (40 + i, 30), (i * 20, 0, 0)).save(folder / f"{i}.png")
    for stem, text in (captions or {}).items():
        (folder / f"{stem}.txt").write_text(text, encoding="utf-8")
    return folder


def dataset(folder, **extra):
    config, problems = config_from_dict({"resolution": "64", "concepts": [{"path": str(folder), "seed": 1}], **extra})
    assert [p for p in problems if p.is_error] == []
    return TrainingDataset(config)


def test_every_image_is_trained_each_epoch_and_the_last_batch_is_filled(tmp_path):
    data = dataset(folder_with(tmp_path, 5), batch_size=2)
    assert data.steps_per_epoch == 3
    for epoch in range(3):
        batches = data.epoch_order(epoch)
        assert [len(b) for b in batches] == [2, 2, 2]
        assert set(Counter(i for b in batches for i in b)) == set(range(5))
    assert data.epoch_order(0) != data.epoch_order(1)  # the order changes per epoch…
    assert data.epoch_order(1) == dataset(tmp_path / "imgs", batch_size=2).epoch_order(1)  # …and is fixed by the seed


def test_captions_one_random_line_per_epoch(tmp_path):
    folder = folder_with(tmp_path, 1, {"0": "first\n\nsecond\nthird\n"})
    data = dataset(folder)
    seen = {data.load_batch([0], epoch, False).captions[0] for epoch in range(30)}
    assert seen == {"first", "second", "third"}


def test_masks_are_loaded_and_resized(tmp_path, caplog):
    folder = folder_with(tmp_path, 2)
    Image.new("L", (10, 10), 255).save(folder / "0-masklabel.png")  # wrong size on purpose
    data = dataset(folder, masked_training=True)
    batch = data.load_batch([0, 1], 0, True)
    assert tuple(batch.pixels.shape) == (2, 3, 64, 64) and tuple(batch.masks.shape) == (2, 1, 64, 64)
    assert batch.masks[0].min().item() == 1.0 and batch.masks[1].min().item() == 1.0  # no mask = the whole image
    assert "mask size differs" in caplog.text
    assert batch.pixels.min().item() >= -1.0 and batch.pixels.max().item() <= 1.0


def test_empty_concepts_are_an_error(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetError, match="no valid training image"):
        dataset(tmp_path / "empty")


def test_gradient_accumulation_pads_to_whole_steps(tmp_path):
    data = dataset(folder_with(tmp_path, 5), batch_size=2, gradient_accumulation_steps=2)
    assert data.steps_per_epoch == 2
    assert len(data.epoch_order(0)) == 4
