"""Batches for the loop, loaded in worker processes (`dataloader_threads`) or in the training thread.

Each optimizer step takes its micro-batches from the epoch's plan, so a resumed run continues mid-epoch exactly.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from onetrainer.data.training_data import Batch, TrainingData


class _EpochBatches(torch.utils.data.Dataset):
    def __init__(self, data: TrainingData, epoch: int, first: int, with_masks: bool, text_cached: bool) -> None:
        self.data, self.epoch, self.with_masks, self.text_cached = data, epoch, with_masks, text_cached
        self.batches = [data.local_part(batch) for batch in data.plan(epoch).batches[first:]]

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, index: int) -> Batch:
        return self.data.load_batch(self.batches[index], self.epoch, self.with_masks, self.text_cached)


def _identity(batch: Batch) -> Batch:
    return batch


def step_batches(
    data: TrainingData, epoch: int, first_step: int, with_masks: bool, text_cached: bool, workers: int
) -> Iterator[list[Batch]]:
    """The micro-batches of each remaining optimizer step of `epoch`, from step `first_step` on."""
    accumulation = data.config.gradient_accumulation_steps
    dataset = _EpochBatches(data, epoch, first_step * accumulation, with_masks, text_cached)
    if workers > 0:
        source = torch.utils.data.DataLoader(
            dataset, batch_size=None, shuffle=False, num_workers=workers, collate_fn=_identity, prefetch_factor=2
        )
    else:
        source = (dataset[i] for i in range(len(dataset)))
    step: list[Batch] = []
    for batch in source:
        step.append(batch)
        if len(step) == accumulation:
            yield step
            step = []
    if step:
        yield step
