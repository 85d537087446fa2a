"""Batches for the loop, loaded in worker processes (`dataloader_threads`) or in the training thread.

One loader serves the rest of the run, epoch after epoch: its worker processes start once and keep loading ahead
across epoch boundaries. (A loader per epoch started its workers again at every boundary and waited for their first
batch: ~90 ms an epoch, about a tenth of a small LoRA's training time on a GPU.) Each optimizer step takes its
micro-batches from its epoch's plan, so a resumed run continues mid-epoch exactly.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from onetrainer.data.training_data import Batch, TrainingData


class _Batches(torch.utils.data.Dataset):
    """Micro-batches to load, in training order: each is (its epoch, its index in the epoch's plan); this rank's
    part of it is loaded."""

    def __init__(self, data: TrainingData, batches: list[tuple[int, int]], with_masks: bool, text_cached: bool) -> None:
        self.data, self.batches, self.with_masks, self.text_cached = data, batches, with_masks, text_cached

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, index: int) -> Batch:
        epoch, batch = self.batches[index]
        samples = self.data.local_part(self.data.plan(epoch).batches[batch])
        return self.data.load_batch(samples, epoch, self.with_masks, self.text_cached)


def _identity(batch: Batch) -> Batch:
    return batch


class RunBatches:
    """The micro-batches of every optimizer step from (`first_epoch`, `first_step`) to the end of the run, through one
    loader. `epoch(e)` gives epoch e's steps; epochs are taken in order. `close` ends the worker processes."""

    def __init__(
        self, data: TrainingData, first_epoch: int, first_step: int, with_masks: bool, text_cached: bool, workers: int
    ) -> None:
        self.accumulation = data.config.gradient_accumulation_steps
        self._first: dict[int, int] = {}  # epoch -> the index of its first micro-batch in the run's list
        self._ends: dict[int, int] = {}
        batches: list[tuple[int, int]] = []
        for epoch in range(first_epoch, data.config.epochs):
            skipped = first_step * self.accumulation if epoch == first_epoch else 0
            self._first[epoch] = len(batches)
            batches += [(epoch, index) for index in range(skipped, len(data.plan(epoch).batches))]
            self._ends[epoch] = len(batches)
        dataset = _Batches(data, batches, with_masks, text_cached)
        if workers > 0:
            loader = torch.utils.data.DataLoader(
                dataset, batch_size=None, shuffle=False, num_workers=workers, collate_fn=_identity, prefetch_factor=2
            )
            self._source: Iterator[Batch] = iter(loader)
        else:
            self._source = (dataset[i] for i in range(len(dataset)))
        self._taken = 0

    def epoch(self, epoch: int) -> Iterator[list[Batch]]:
        """The micro-batches of each remaining optimizer step of `epoch` (the last step may have fewer)."""
        while self._taken < self._first.get(epoch, self._taken):  # an earlier epoch left unfinished
            self._next()
        step: list[Batch] = []
        while self._taken < self._ends.get(epoch, self._taken):
            step.append(self._next())
            if len(step) == self.accumulation:
                yield step
                step = []
        if step:
            yield step

    def _next(self) -> Batch:
        self._taken += 1
        return next(self._source)

    def close(self) -> None:
        """End the worker processes (the loader's iterator shuts them down when it is released)."""
        self._source = iter(())
