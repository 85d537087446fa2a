"""What each epoch trains, decided up front and fixed by the seeds: which images (balancing), at which bucket
(aspect and resolution), in which batches and order.

A batch never mixes buckets, so every step trains at one resolution. By default every image is trained at least once
per epoch: when a bucket's image count is not a multiple of the batch size, its last batch is filled with other
images of the same bucket (listed as fillers). With `drop_incomplete_batches`, OneTrainer's behaviour, the remainder is
dropped instead, and the dropped images are listed.
"""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from onetrainer.config.enums import BalancingStrategy
from onetrainer.config.resolution import parse_resolution
from onetrainer.data.buckets import Bucket, buckets_for, nearest_bucket
from onetrainer.data.scan import ImageEntry

if TYPE_CHECKING:
    from onetrainer.config import TrainConfig


def hash_seed(*parts: int) -> int:
    value = 0x345678
    for part in parts:
        value = (value * 1000003) ^ (int(part) & 0xFFFFFFFFFFFF)
    return value & 0x7FFFFFFF


@dataclass(frozen=True)
class PlannedSample:
    image: int  # index into the dataset's image list
    bucket: Bucket
    variation: int  # which augmented variation (and cache entry) of the image this epoch uses
    filler: bool = False  # added only to fill its batch


@dataclass
class EpochPlan:
    epoch: int
    batches: list[list[PlannedSample]]
    dropped: list[PlannedSample] = field(default_factory=list)  # left out by drop_incomplete_batches

    @property
    def fillers(self) -> list[int]:
        return [s.image for batch in self.batches for s in batch if s.filler]

    def steps(self, accumulation: int) -> int:
        return -(-len(self.batches) // accumulation)


def plan_epoch(
    images: list[ImageEntry], config: TrainConfig, epoch: int, step: int, seed: int, batch_size: int | None = None
) -> EpochPlan:
    """The plan of one epoch over the trained images (`images`), for a family with bucket step `step`, in batches of
    `batch_size` (the config's; the global batch when several processes train, each taking a slice)."""
    by_concept: dict[int, list[int]] = defaultdict(list)
    for index, entry in enumerate(images):
        by_concept[entry.concept].append(index)
    chosen: list[PlannedSample] = []
    for concept_index, members in sorted(by_concept.items()):
        concept = config.concepts[concept_index]
        rng = random.Random(hash_seed(concept.seed, epoch, 1))
        variations = max(1, concept.image_variations)
        variation = epoch % variations if config.latent_caching else epoch
        resolution = parse_resolution(
            concept.image.resolution_override if concept.image.enable_resolution_override else config.resolution
        )
        grids = buckets_for(resolution, step, config.aspect_ratio_bucketing)
        for index in _balanced(members, concept, rng):
            entry = images[index]
            grid = grids[0] if len(grids) == 1 else grids[rng.randrange(len(grids))]
            chosen.append(PlannedSample(index, bucket_of(entry, grid), variation))
    # A batch's images have as many reference images each (an edit model that also trains plain text to image batches
    # the two apart): their reference tokens stack. Families without references: one group per bucket, as before.
    references = [len(entry.references) for entry in images]
    return _batched(chosen, config, epoch, seed, batch_size or config.batch_size, lambda s: references[s.image])


def bucket_of(entry: ImageEntry, grid: tuple[Bucket, ...]) -> Bucket:
    """The entry's bucket of `grid`: the nearest aspect, and on a video model type its frames (temporal bucket)."""
    bucket = nearest_bucket(entry.width, entry.height, grid)
    return replace(bucket, frames=entry.frames) if entry.frames else bucket


def _balanced(members: list[int], concept, rng: random.Random) -> list[int]:
    """The images of a concept for one epoch: REPEATS (fractions take a different random subset each epoch) or an
    exact number of SAMPLES."""
    n = len(members)
    if n == 0 or concept.balancing <= 0:
        return []
    if concept.balancing_strategy is BalancingStrategy.SAMPLES:
        count = int(concept.balancing)
        shuffled = members[:]
        rng.shuffle(shuffled)
        return [shuffled[i % n] for i in range(count)]
    whole = int(concept.balancing)
    extra = int((concept.balancing - whole) * n)
    out = members * whole + rng.sample(members, extra)
    return out or [rng.choice(members)]


def _batched(
    samples: list[PlannedSample], config: TrainConfig, epoch: int, seed: int, size: int, kind=lambda sample: 0
) -> EpochPlan:
    """Batches of one bucket and one `kind` each (the number of reference images)."""
    rng = random.Random(hash_seed(seed, epoch, 2))
    by_bucket: dict[tuple[Bucket, int], list[PlannedSample]] = defaultdict(list)
    for sample in samples:
        by_bucket[sample.bucket, kind(sample)].append(sample)
    batches: list[list[PlannedSample]] = []
    dropped: list[PlannedSample] = []
    for bucket in sorted(by_bucket):
        members = by_bucket[bucket]
        rng.shuffle(members)
        for start in range(0, len(members), size):
            batch = members[start : start + size]
            if len(batch) < size:
                if config.drop_incomplete_batches:
                    dropped += batch
                    continue
                batch = batch + _fillers(members, batch, size - len(batch), rng)
            batches.append(batch)
    rng.shuffle(batches)
    return EpochPlan(epoch, batches, dropped)


def _fillers(members: list[PlannedSample], batch: list[PlannedSample], count: int, rng) -> list[PlannedSample]:
    """Other images of the same bucket (repeating the bucket's images when it is smaller than a batch)."""
    in_batch = {s.image for s in batch}
    others = [s for s in members if s.image not in in_batch] or members
    picks = [others[i % len(others)] for i in rng.sample(range(len(others)), min(count, len(others)))]
    while len(picks) < count:
        picks.append(rng.choice(members))
    return [PlannedSample(s.image, s.bucket, s.variation, filler=True) for s in picks]
