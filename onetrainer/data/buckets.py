"""Aspect-ratio buckets: each image trains at the bucket whose shape is closest to its own.

The buckets of a target resolution R have about R² pixels and the aspect ratios 1:1 … 1:4 in both orientations, with
width and height rounded to the family's quantization step (`FamilyInfo.bucket_step`: 8 to 128 px today). An image
is scaled to cover its bucket and cropped, so small images are upscaled and never dropped for their size.

On a video model type a bucket also has a frame count (its temporal bucket: the frames of each sample, a count the
family's VAE takes; 1 for a still), so that a batch never mixes clip lengths. Images on image model types have none.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

from onetrainer.config.resolution import Resolution

ASPECT_RATIOS = (1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0)


@dataclass(frozen=True, order=True)
class Bucket:
    width: int
    height: int
    frames: int = 0  # a video model type's frames per sample (0: an image model type's image)

    @property
    def aspect(self) -> float:
        return self.height / self.width

    def __str__(self) -> str:
        return f"{self.width}x{self.height}" + (f" {self.frames}f" if self.frames else "")


def _round_to(value: float, step: int) -> int:
    return max(step, round(value / step) * step)


@cache
def bucket_grid(resolution: int, step: int) -> tuple[Bucket, ...]:
    """The buckets for a target resolution: R² pixels, every aspect ratio in both orientations, sorted by aspect."""
    area = resolution * resolution
    buckets = set()
    for ratio in ASPECT_RATIOS:
        for aspect in (ratio, 1.0 / ratio):  # height / width
            width = math.sqrt(area / aspect)
            buckets.add(Bucket(_round_to(width, step), _round_to(width * aspect, step)))
    return tuple(sorted(buckets, key=lambda b: b.aspect))


@cache  # every epoch plans each image again: a dataset has few distinct sizes
def nearest_bucket(width: int, height: int, grid: tuple[Bucket, ...]) -> Bucket:
    aspect = height / width
    return min(grid, key=lambda b: (abs(b.aspect - aspect), b.width))


def buckets_for(resolution: Resolution, step: int, bucketing: bool) -> list[tuple[Bucket, ...]]:
    """The bucket grids a sample can draw from: one per listed size (one fixed bucket for an exact size)."""
    if resolution.exact:
        width, height = resolution.exact
        return [(Bucket(_round_to(width, step), _round_to(height, step)),)]
    if not bucketing:
        return [(Bucket(_round_to(size, step), _round_to(size, step)),) for size in resolution.sizes]
    return [bucket_grid(size, step) for size in resolution.sizes]


def cover_size(width: int, height: int, bucket: Bucket) -> tuple[int, int]:
    """The size an image is scaled to so that it covers the bucket (then it is cropped to the bucket)."""
    scale = max(bucket.width / width, bucket.height / height)
    return max(bucket.width, round(width * scale)), max(bucket.height, round(height * scale))
