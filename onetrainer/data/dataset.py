"""A minimal training set: each concept's images with captions (and masks), one square crop at the resolution.

Batches come in an order fixed by the seed and the epoch, and every image is trained at least once per epoch: a last
batch that would be short is filled with other images of the epoch.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from onetrainer.config.enums import BalancingStrategy, ConceptType
from onetrainer.config.resolution import parse_resolution
from onetrainer.data.images import caption_lines, list_images, mask_path_of, open_mask, open_rgb, read_text

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Sample:
    image: Path
    concept_index: int
    loss_weight: float
    captions: tuple[str, ...]  # one is drawn per epoch
    mask: Path | None


@dataclass
class Batch:
    indices: list[int]
    pixels: torch.Tensor  # [B, 3, H, W] in [-1, 1]
    masks: torch.Tensor | None  # [B, 1, H, W] in [0, 1], white = train
    captions: list[str]
    loss_weights: torch.Tensor  # [B]


class DatasetError(Exception):
    pass


class TrainingDataset:
    def __init__(self, config, resolve_path=lambda p: Path(p)) -> None:
        self.config = config
        self.resolution = parse_resolution(config.resolution).largest
        self.samples: list[Sample] = []
        self.problems: list[str] = []
        for index, concept in enumerate(config.concepts or []):
            if not concept.enabled or concept.type is ConceptType.VALIDATION:
                continue
            self._add_concept(index, concept, resolve_path(concept.path))
        if not self.samples:
            raise DatasetError("no valid training image found in the enabled concepts")

    def _add_concept(self, index: int, concept, folder: Path) -> None:
        if not folder.is_dir():
            self.problems.append(f"concept '{concept.name or concept.path}': folder not found: {folder}")
            return
        images = list_images(folder, concept.include_subdirectories)
        if not images:
            self.problems.append(f"concept '{concept.name or concept.path}': no images in {folder}")
        whole_file = []
        if concept.text.prompt_source == "concept" and concept.text.prompt_path:
            whole_file = caption_lines(read_text(Path(concept.text.prompt_path)))
        samples = []
        for image in images:
            if concept.text.prompt_source == "filename":
                captions = (image.stem,)
            elif concept.text.prompt_source == "concept":
                captions = tuple(whole_file) or ("",)
            else:
                caption_file = image.with_suffix(".txt")
                captions = tuple(caption_lines(read_text(caption_file))) if caption_file.exists() else ("",)
            mask = mask_path_of(image)
            samples.append(
                Sample(image, index, concept.loss_weight, captions or ("",), mask if mask.exists() else None)
            )
        self.samples += _balanced(samples, concept)

    # -- order ----------------------------------------------------------------------------------------------------

    @property
    def steps_per_epoch(self) -> int:
        """Optimizer steps per epoch (batches divided by gradient accumulation, rounded up)."""
        batches = -(-len(self.samples) // self.config.batch_size)
        return -(-batches // self.config.gradient_accumulation_steps)

    def epoch_order(self, epoch: int) -> list[list[int]]:
        """Batches of sample indices for an epoch; the last batch is filled so no image is left out."""
        rng = random.Random(hash_seed(self.config_seed, epoch))
        order = list(range(len(self.samples)))
        rng.shuffle(order)
        size = self.config.batch_size
        batches = [order[i : i + size] for i in range(0, len(order), size)]
        last = batches[-1]
        if len(last) < size:
            others = [i for i in order if i not in last]
            while len(last) < size:
                last.append(rng.choice(others) if others else last[len(last) % len(last)])
        # Pad to whole optimizer steps so every step accumulates the same number of batches.
        accumulation = self.config.gradient_accumulation_steps
        while len(batches) % accumulation:
            batches.append([rng.choice(order) for _ in range(size)])
        return batches

    @property
    def config_seed(self) -> int:
        concepts = self.config.concepts or []
        return sum(c.seed for c in concepts) & 0x7FFFFFFF

    # -- loading --------------------------------------------------------------------------------------------------

    def load_batch(self, indices: list[int], epoch: int, with_masks: bool) -> Batch:
        pixels, masks, captions = [], [], []
        for i in indices:
            sample = self.samples[i]
            original = open_rgb(sample.image)
            pixels.append(_to_tensor(_square(original, self.resolution)) * 2.0 - 1.0)
            if with_masks:
                if sample.mask is not None:
                    mask = open_mask(sample.mask)
                    if mask.size != original.size:
                        log.warning("%s: mask size differs from its image; resized", sample.mask)
                        mask = mask.resize(original.size, Image.Resampling.BILINEAR)
                    masks.append(_to_tensor(_square(mask, self.resolution)))
                else:
                    masks.append(torch.ones(1, self.resolution, self.resolution))
            rng = random.Random(hash_seed(self.config_seed, epoch, i))
            captions.append(rng.choice(sample.captions))
        return Batch(
            indices=list(indices),
            pixels=torch.stack(pixels),
            masks=torch.stack(masks) if with_masks else None,
            captions=captions,
            loss_weights=torch.tensor([self.samples[i].loss_weight for i in indices], dtype=torch.float32),
        )


def _balanced(samples: list[Sample], concept) -> list[Sample]:
    if not samples:
        return samples
    if concept.balancing_strategy is BalancingStrategy.SAMPLES:
        count = int(concept.balancing)
    else:
        count = int(len(samples) * concept.balancing)
    count = max(count, 1) if concept.balancing > 0 else 0
    return [samples[i % len(samples)] for i in range(count)]


def hash_seed(*parts: int) -> int:
    value = 0x345678
    for part in parts:
        value = (value * 1000003) ^ (int(part) & 0xFFFFFFFFFFFF)
    return value & 0x7FFFFFFF


def _square(image: Image.Image, size: int) -> Image.Image:
    """Scale the shorter side to `size` (small images are upscaled), then take the centred square."""
    w, h = image.size
    scale = size / min(w, h)
    resized = image.resize((max(size, round(w * scale)), max(size, round(h * scale))), Image.Resampling.BICUBIC)
    left = (resized.width - size) // 2
    top = (resized.height - size) // 2
    return resized.crop((left, top, left + size, top + size))


def _to_tensor(image: Image.Image) -> torch.Tensor:
    array = np.asarray(image, dtype=np.float32) / 255.0
    if array.ndim == 2:
        array = array[:, :, None]
    return torch.from_numpy(array).permute(2, 0, 1).contiguous()
