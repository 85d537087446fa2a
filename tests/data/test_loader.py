"""One loader serves the whole run: each epoch's steps come from it in plan order, from a resumed step on."""

from __future__ import annotations

from onetrainer.data.loader import RunBatches
from tests.data.test_datasets import data_for
from tests.helpers import image_folder


def _images(steps) -> list[list[tuple[int, str]]]:
    return [[(s.image, str(s.bucket)) for batch in step for s in batch.samples] for step in steps]


def _planned(data, epoch: int, first: int = 0) -> list[list[tuple[int, str]]]:
    return [[(s.image, str(s.bucket)) for s in batch] for batch in data.plan(epoch).batches[first:]]


def test_the_run_batches_follow_each_epochs_plan_from_the_resumed_step(tmp_path):
    folder = image_folder(tmp_path, count=4)
    data = data_for({"resolution": "64", "batch_size": 1, "epochs": 3, "concepts": [{"path": str(folder)}]})
    batches = RunBatches(data, first_epoch=0, first_step=1, with_masks=False, text_cached=False, workers=0)
    assert _images(batches.epoch(0)) == _planned(data, 0, first=1)
    first_of_epoch_1 = next(batches.epoch(1))  # a stop in the middle of an epoch
    assert _images([first_of_epoch_1]) == _planned(data, 1)[:1]
    assert _images(batches.epoch(2)) == _planned(data, 2)  # not what epoch 1 left over
    batches.close()


def test_steps_take_their_accumulated_micro_batches(tmp_path):
    folder = image_folder(tmp_path, count=3)
    config = {"resolution": "64", "batch_size": 1, "gradient_accumulation_steps": 2, "epochs": 2}
    data = data_for({**config, "concepts": [{"path": str(folder)}]})
    batches = RunBatches(data, first_epoch=1, first_step=0, with_masks=False, text_cached=False, workers=0)
    steps = list(batches.epoch(1))
    assert [len(step) for step in steps] == [2, 1]  # the last step of an epoch may have fewer
    assert [micro for step in _images(steps) for micro in step] == [micro for b in _planned(data, 1) for micro in b]
