"""The training set of a run: scanned concepts, the plan of every epoch, and batches loaded from files or the cache."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from onetrainer.config.enums import ConceptType
from onetrainer.config.model_types import model_type_info
from onetrainer.data.cache import DiskCache, cache_key
from onetrainer.data.plan import EpochPlan, PlannedSample, hash_seed, plan_epoch
from onetrainer.data.samples import caption_for, load_references, load_sample
from onetrainer.data.scan import (
    ConceptScan,
    ImageEntry,
    fingerprint,
    is_trained,
    scan_concepts,
    text_reads_references,
    trains_on_references,
)

if TYPE_CHECKING:
    from onetrainer.config import TrainConfig

log = logging.getLogger(__name__)
EXTRA_PREFIX = "extra/"  # the family's `cache_extras` in a latent cache entry


class DatasetError(Exception):
    pass


@dataclass
class Batch:
    samples: list[PlannedSample]
    captions: list[str]
    loss_weights: torch.Tensor  # [B]
    concept_types: list[ConceptType]
    original_sizes: list[tuple[int, int]]  # (height, width) of each image before scaling
    crop_offsets: list[tuple[int, int]]  # (top, left) of the crop in the scaled image
    pixels: torch.Tensor | None = None  # [B, 3, H, W] in [-1, 1] (None when the latents come from the cache)
    # [B, 1, H, W] in [0, 1]; [B, 1, F, H, W] where a clip of the batch has a mask clip (`stack_masks`)
    masks: torch.Tensor | None = None
    latents: torch.Tensor | None = None  # cached latents [B, C, h, w]
    cached_extras: dict[str, torch.Tensor] = field(default_factory=dict)  # the family's cached extras, stacked
    # each sample's reference images ([3, h, w] in [-1, 1]), where the family learns from them
    references: list[list[torch.Tensor]] | None = None
    # each sample's `TrainingData.reference_key`, where the family learns from references (keys its cached conditioning)
    reference_keys: list[str] | None = None
    # each sample's depth map file [1, H, W] moved as its image (None where it has none), for a model type with a
    # depth input whose latents are not cached
    depths: list[torch.Tensor | None] | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def size(self) -> int:
        return len(self.samples)


def held_out_images(scans: list[ConceptScan], config: TrainConfig) -> dict[int, list[ImageEntry]]:
    """`validation_holdout` images of each STANDARD concept (with validation on), in the concept's image order: the
    same ones every run (chosen by a hash of the file's name and the concept's seed, so adding images rarely changes
    them); a concept keeps at least one image to train on. A clip is held out or trained whole (all its windows)."""
    count = config.validation_holdout if config.validation else 0
    held: dict[int, list[ImageEntry]] = {}
    for scan in scans:
        files = list(dict.fromkeys(e.path for e in scan.images))
        if count <= 0 or scan.kind is not ConceptType.STANDARD or len(files) < 2:
            continue
        seed = config.concepts[scan.index].seed
        ranked = sorted(files, key=lambda path: _holdout_rank(path, scan.folder, seed))
        chosen = set(ranked[: min(count, len(files) - 1)])
        held[scan.index] = [e for e in scan.images if e.path in chosen]
    return held


def _holdout_rank(path: Path, folder: Path, seed: int) -> int:
    try:
        name = path.relative_to(folder).as_posix()
    except ValueError:
        name = path.name
    return int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest()[:8], "big")


class TrainingData:
    def __init__(self, config: TrainConfig, bucket_step: int, resolve=lambda p: Path(p), video=...) -> None:
        """`video`: how clips train (`video.VideoRule`), by default the model type's (`scan.video_rule`; None for an
        image model type, whose concepts' clips are named and skipped)."""
        self.config = config
        self.bucket_step = bucket_step
        try:
            self.scans: list[ConceptScan] = scan_concepts(config, resolve, video)
        except ValueError as e:  # the run's frames per clip is not a count
            raise DatasetError(str(e)) from e
        # concept index → the images set aside for validation (`validation_holdout`), never trained
        self.held_out: dict[int, list[ImageEntry]] = held_out_images(self.scans, config)
        kept = {id(e) for held in self.held_out.values() for e in held}
        self.images: list[ImageEntry] = [e for s in self.scans if is_trained(s) for e in s.images if id(e) not in kept]
        self.validation_images: list[ImageEntry] = [
            e for s in self.scans if s.kind is ConceptType.VALIDATION for e in s.images
        ] + [e for held in self.held_out.values() for e in held]
        if not self.images:
            details = "; ".join(f"{s.name}: {p}" for s in self.scans for p in s.problems)
            unreadable = sum(len(s.unreadable) for s in self.scans)
            extra = f" ({unreadable} unreadable files)" if unreadable else ""
            raise DatasetError(
                f"no valid training image in the enabled concepts{extra}" + (f": {details}" if details else "")
            )
        self.seed = hash_seed(*[c.seed for c in config.concepts or []])
        self._plans: dict[int, EpochPlan] = {}
        self.rank, self.world_size = 0, 1  # several processes: plans at the global batch, each rank a slice
        self.latent_cache: DiskCache | None = None
        self.latent_key_base: dict | None = None
        # the family learns from reference images: each batch carries them, decoded with the images
        self.with_references = trains_on_references(config)
        # ... and its text encoder reads them with each caption: the text cache keys each caption with its references
        self.text_with_references = text_reads_references(config)
        # the model type takes a depth map of each image: its depth map file, moved as the image, where it has one
        self.with_depth = model_type_info(config.model_type).depth_input
        self._keys: dict[tuple, str] = {}
        self._keys_base: dict | None = None
        self._reference_keys: dict[tuple, str] = {}
        self._captions: dict[tuple[int, int], str] = {}

    # -- the plan -------------------------------------------------------------------------------------------------

    def plan(self, epoch: int) -> EpochPlan:
        if epoch not in self._plans:
            size = self.config.batch_size * self.world_size
            self._plans[epoch] = plan_epoch(self.images, self.config, epoch, self.bucket_step, self.seed, size)
        return self._plans[epoch]

    def leave_out(self, indices) -> None:
        """Train without these images (by index; e.g. ones that cannot be decoded): plans and remembered keys and
        captions are made again, as the other images' indices change."""
        self.images = [e for i, e in enumerate(self.images) if i not in indices]
        self._plans.clear()
        self._keys.clear()
        self._reference_keys.clear()
        self._captions.clear()

    def shard(self, rank: int, world_size: int) -> None:
        """Train as rank `rank` of `world_size`: the plan is made at the global batch, `local_part` is this rank's."""
        self.rank, self.world_size = rank, world_size
        self._plans.clear()

    def local_part(self, batch: list[PlannedSample]) -> list[PlannedSample]:
        """This rank's samples of a global batch (a contiguous slice, so sample i of the batch is the i-th draw)."""
        size = len(batch) // self.world_size
        return batch[self.rank * size : (self.rank + 1) * size]

    def steps_in_epoch(self, epoch: int) -> int:
        return self.plan(epoch).steps(self.config.gradient_accumulation_steps)

    def total_steps(self) -> int:
        return sum(self.steps_in_epoch(e) for e in range(self.config.epochs))

    def step_batches(self, epoch: int, step: int) -> list[list[PlannedSample]]:
        """The micro-batches of optimizer step `step` of `epoch` (the last step of an epoch may have fewer)."""
        accumulation = self.config.gradient_accumulation_steps
        return self.plan(epoch).batches[step * accumulation : (step + 1) * accumulation]

    def concept(self, sample: PlannedSample):
        return self.config.concepts[self.images[sample.image].concept]

    def text_variation(self, sample: PlannedSample, epoch: int, text_cached: bool) -> int:
        variations = max(1, self.concept(sample).text_variations)
        return epoch % variations if text_cached else epoch

    # -- loading --------------------------------------------------------------------------------------------------

    def latent_key(self, sample: PlannedSample, masked: bool) -> str:
        """The cache key of a sample's latents; remembered, as every step asks again for the same few (hashing a
        concept's settings costs more than the rest of the batch's loading on a small model)."""
        memo = (sample.image, str(sample.bucket), sample.variation, masked)
        if self._keys_base is not self.latent_key_base:
            self._keys, self._keys_base = {}, self.latent_key_base
        key = self._keys.get(memo)
        if key is None:
            key = self._keys[memo] = self._latent_key(sample, masked)
        return key

    def _latent_key(self, sample: PlannedSample, masked: bool) -> str:
        entry = self.images[sample.image]
        parts = {
            **(self.latent_key_base or {}),
            "mask": _mask_fingerprint(entry) if masked else None,
            **self._sample_parts(sample),
        }
        return cache_key(parts)

    def _sample_parts(self, sample: PlannedSample) -> dict:
        """What a sample's pixels (and its references') depend on: the files, the bucket, the variation, the concept's
        seed and augmentation."""
        entry = self.images[sample.image]
        concept = self.config.concepts[entry.concept]
        parts = {
            "file": entry.fingerprint,
            "bucket": str(sample.bucket),
            "variation": sample.variation,
            "seed": concept.seed,
            "augmentation": concept.image.to_dict(),
        }
        if entry.clip is not None:  # only here, so the keys of images stay what they were
            parts["window"] = entry.window
            parts["video"] = concept.video.to_dict()
        if self.with_references:  # only here, so the keys of families without references stay what they were
            parts["references"] = [_fingerprint_or_gone(path) for path in entry.references]
        if self.with_depth:  # likewise: its depth map file, or the estimator's (none)
            parts["depth"] = _fingerprint_or_gone(entry.depth) if entry.depth is not None else None
        return parts

    def reference_key(self, sample: PlannedSample) -> str:
        """What identifies a sample's reference images as the family sees them (their files, moved as the image is):
        with the caption, the key of an edit model's cached conditioning."""
        memo = (sample.image, str(sample.bucket), sample.variation)
        key = self._reference_keys.get(memo)
        if key is None:
            key = self._reference_keys[memo] = cache_key({"kind": "references", **self._sample_parts(sample)})
        return key

    def load_references(self, samples: list[PlannedSample]) -> list[list[torch.Tensor]]:
        """Each sample's reference images ([3, h, w] in [-1, 1]), decoded from their files (the image itself is not)."""
        return [load_references(self.images[s.image], s, self.concept(s)) for s in samples]

    def load_batch(
        self, samples: list[PlannedSample], epoch: int, with_masks: bool, text_cached: bool = False
    ) -> Batch:
        """A batch from the latent cache when every sample is in it, else decoded from the files."""
        cached = self._cached(samples, with_masks)
        captions = [self._caption(s, self.text_variation(s, epoch, text_cached)) for s in samples]
        batch = Batch(
            samples=list(samples),
            captions=captions,
            loss_weights=torch.tensor([self.concept(s).loss_weight for s in samples], dtype=torch.float32),
            concept_types=[self.concept(s).type for s in samples],
            original_sizes=[],
            crop_offsets=[],
        )
        if self.text_with_references:
            batch.reference_keys = [self.reference_key(s) for s in samples]
        if cached is not None:
            batch.latents = torch.stack([c["latents"] for c in cached])
            batch.original_sizes = [tuple(c["original_size"].tolist()) for c in cached]
            batch.crop_offsets = [tuple(c["crop_offset"].tolist()) for c in cached]
            if with_masks:
                batch.masks = stack_masks([c["mask"] for c in cached])
            names = [k for k in cached[0] if k.startswith(EXTRA_PREFIX)]
            batch.cached_extras = {k[len(EXTRA_PREFIX) :]: _stack(k, [c[k] for c in cached]) for k in names}
            if self.text_with_references and not text_cached:  # the text encoder reads them with the caption each step
                batch.references = self.load_references(samples)
            return batch
        loaded = [self._load_one(samples, s, with_masks, batch.problems) for s in samples]
        batch.pixels = torch.stack([s.pixels for s in loaded])
        if self.with_references:
            batch.references = [s.references for s in loaded]
        if self.with_depth:
            batch.depths = [s.depth for s in loaded]
        batch.original_sizes = [s.original_size for s in loaded]
        batch.crop_offsets = [s.crop_offset for s in loaded]
        if with_masks:
            batch.masks = stack_masks([s.mask for s in loaded])
        return batch

    def _caption(self, sample: PlannedSample, variation: int) -> str:
        """The sample's caption of that text variation (remembered: it depends on the image and the variation only)."""
        memo = (sample.image, variation)
        caption = self._captions.get(memo)
        if caption is None:
            entry = self.images[sample.image]
            caption = self._captions[memo] = caption_for(entry, sample, self.concept(sample), variation)
        return caption

    def _cached(self, samples: list[PlannedSample], with_masks: bool) -> list[dict] | None:
        if self.latent_cache is None:
            return None
        entries = []
        for sample in samples:
            entry = self.latent_cache.get(self.latent_key(sample, with_masks))
            if entry is None:
                return None  # e.g. removed meanwhile: this batch is decoded from the files
            entries.append(entry)
        return entries

    def validation_batches(self, with_masks: bool, rank: int = 0, world_size: int = 1) -> Iterator[tuple[int, Batch]]:
        """(index into `validation_images`, its batch) for each validation image, at the first resolution, with its
        first caption line; several ranks each get every `world_size`-th image, from `rank` on."""
        from onetrainer.config.resolution import parse_resolution
        from onetrainer.data.buckets import buckets_for
        from onetrainer.data.plan import bucket_of

        config = self.config
        grid = buckets_for(parse_resolution(config.resolution), self.bucket_step, config.aspect_ratio_bucketing)[0]
        for index in range(rank, len(self.validation_images), world_size):
            entry = self.validation_images[index]
            concept = config.concepts[entry.concept]
            sample = PlannedSample(index, bucket_of(entry, grid), 0)
            try:
                loaded = load_sample(entry, sample, concept, with_masks, self.with_references, self.with_depth)
            except (OSError, ValueError, SyntaxError):
                continue  # reported by the scan's preflight; a validation image never stops training
            yield (
                index,
                Batch(
                    references=[loaded.references] if self.with_references else None,
                    samples=[sample],
                    captions=[entry.captions[0]],
                    loss_weights=torch.ones(1),
                    concept_types=[concept.type],
                    original_sizes=[loaded.original_size],
                    crop_offsets=[loaded.crop_offset],
                    pixels=loaded.pixels[None],
                    masks=loaded.mask[None] if loaded.mask is not None else None,
                    depths=[loaded.depth] if self.with_depth else None,
                ),
            )

    def _load_one(self, batch: list[PlannedSample], sample: PlannedSample, with_mask: bool, problems: list[str]):
        """Load a sample; an image that fails to decode is reported and replaced by another of the same batch."""
        candidates = [sample] + [s for s in batch if s.image != sample.image]
        for candidate in candidates:
            entry = self.images[candidate.image]
            try:
                return load_sample(
                    entry,
                    PlannedSample(candidate.image, sample.bucket, sample.variation),
                    self.concept(candidate),
                    with_mask,
                    self.with_references,
                    self.with_depth,
                )
            except (OSError, ValueError, SyntaxError) as e:
                problems.append(f"{entry.path}: cannot be decoded ({e}); another image of the batch is used instead")
        raise DatasetError(f"no image of a batch could be decoded: {[str(self.images[s.image].path) for s in batch]}")


def cached_mask(mask: torch.Tensor) -> torch.Tensor:
    """A mask as the latent cache keeps it: a mask clip's frames ([1, F, H, W], F times an image's) as bytes, exactly
    (a mask's values are whole 255ths: it is decoded from 8-bit greyscale and moved as a PIL "L" image), a quarter of
    float32's size; an image's as it is. `stack_masks` reads either."""
    return (mask * 255).round().to(torch.uint8) if mask.dim() == 4 else mask


def stack_masks(masks: list[torch.Tensor]) -> torch.Tensor:
    """A batch's masks: [B, 1, H, W]; where one is a mask clip's ([1, F, H, W]) the clips' one masks are repeated over
    their F frames, so the batch is [B, 1, F, H, W] (a batch holds one frame count)."""
    masks = [mask.float() / 255 if mask.dtype == torch.uint8 else mask for mask in masks]
    if all(mask.dim() == 3 for mask in masks):
        return torch.stack(masks)
    frames = next(mask.shape[1] for mask in masks if mask.dim() == 4)
    return torch.stack([mask if mask.dim() == 4 else mask[:, None].expand(-1, frames, -1, -1) for mask in masks])


def _mask_fingerprint(entry: ImageEntry) -> str | None:
    if entry.mask is None:
        return None
    stat = entry.mask.stat()
    return f"{entry.mask}|{stat.st_size}|{stat.st_mtime_ns}"


def _fingerprint_or_gone(path: Path) -> str:
    try:
        return fingerprint(path)
    except OSError:  # removed meanwhile: the key misses, and loading the sample reports the file
        return f"{path}|gone"


def _stack(name: str, values: list[torch.Tensor]) -> torch.Tensor:
    try:
        return torch.stack(values)
    except RuntimeError as e:  # e.g. the reference images of a batch's samples differ in size or count
        raise DatasetError(
            f"the cached '{name[len(EXTRA_PREFIX) :]}' of a batch's images differ in shape ({e}); an edit model with "
            "references of different sizes trains at batch size 1 (use gradient accumulation for larger batches)"
        ) from e
