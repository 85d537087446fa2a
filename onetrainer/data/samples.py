"""Turning a planned sample into tensors: decode, augment, scale to cover the bucket, crop; the caption for the epoch.

Every random choice comes from generators seeded by the concept seed, the sample's variation (or the epoch) and the
image, so a sample looks the same whenever it is loaded: in a worker process, after a resume, or when it is cached. An
image's augmentation draws follow its file name, not its place in the scan, so adding or removing other images leaves
them (and its cached latents) as they were.

On a video model type a sample is a clip: [3, F, H, W], its F frames cut from the clip (`data/video.py`) and each
scaled, cropped, flipped, turned and coloured by the same draws (a still is a one-frame clip).
"""

from __future__ import annotations

import hashlib
import logging
import random
from dataclasses import dataclass, field

import numpy as np
import torch
from PIL import Image

from onetrainer.data.buckets import cover_size
from onetrainer.data.images import open_mask, open_rgb
from onetrainer.data.plan import PlannedSample, hash_seed
from onetrainer.data.scan import ImageEntry
from onetrainer.data.video import is_mask_clip

log = logging.getLogger(__name__)


@dataclass
class LoadedSample:
    pixels: torch.Tensor  # [3, H, W] in [-1, 1]; on a video model type [3, F, H, W] (F = the bucket's frames)
    # [1, H, W] in [0, 1], white = train (one for a whole clip); a clip with a mask clip: [1, F, H, W], one per frame
    mask: torch.Tensor | None
    original_size: tuple[int, int]  # (height, width) before scaling
    crop_offset: tuple[int, int]  # (top, left) in the scaled image
    # the image's reference images, each [3, h, w] in [-1, 1] at its own size, cropped, flipped and turned as the image
    references: list[torch.Tensor] = field(default_factory=list)
    # with `with_depth`: the image's depth map file [1, H, W] (its values as the file has them, larger = nearer),
    # scaled, cropped, flipped and turned exactly as the image; None where the image has none
    depth: torch.Tensor | None = None


def image_rng(concept, planned: PlannedSample, entry: ImageEntry) -> random.Random:
    """The draws of a sample's image augmentation (crop jitter, flip, rotation, …): seeded by the concept's seed, the
    variation and the image's file name, not its place in the scan. So an image is cropped and turned the same way when
    other images are added or removed: its cached latents, and an edit model's references cached with the caption, stay
    in step with what the image gives now. Each window of a clip draws its own."""
    if entry.window:
        return random.Random(hash_seed(concept.seed, planned.variation, _name_seed(entry.path.name), 3, entry.window))
    return random.Random(hash_seed(concept.seed, planned.variation, _name_seed(entry.path.name), 3))


def _name_seed(name: str) -> int:
    return int.from_bytes(hashlib.sha256(name.encode("utf-8")).digest()[:6], "big")


def load_sample(
    entry: ImageEntry,
    planned: PlannedSample,
    concept,
    with_mask: bool,
    with_references: bool = False,
    with_depth: bool = False,
) -> LoadedSample:
    """The sample's pixels (and mask); `with_references`: also its reference images, moved as the image is (the same
    share of each cropped away, the same flip and rotation; their colours untouched); `with_depth`: also its depth map
    file, moved exactly as the image is."""
    rng = image_rng(concept, planned, entry)
    indexes = window_of(entry, planned, concept) if entry.clip is not None else None
    frames = [open_rgb(entry.path)] if indexes is None else _decode(entry.path, indexes)
    size = frames[0].size
    mask = None
    frame_masks = None  # a mask clip's frames, one per frame of the window
    if with_mask:
        if entry.mask is not None and indexes is not None and is_mask_clip(entry.mask):
            frame_masks = [_fit(m.convert("L"), size) for m in _decode(entry.mask, indexes)]
        elif entry.mask is not None:
            mask = _fit(open_mask(entry.mask), size)
        else:
            mask = Image.new("L", size, 255)  # no mask: the whole image trains
    if not entry.frames:
        loaded = _load_image(frames[0], mask, entry, planned, concept, rng, with_references)
        if with_depth and entry.depth is not None:
            loaded.depth = _moved_depth(entry, frames[0].size, mask, planned, concept)
        return loaded
    # A clip (or a still on a video model type): every frame takes the same draws, from a copy of the generator's state.
    # With a mask clip the mask-driven crops (`circular_mask_shrink`, `random_mask_rotate_crop`) are drawn on the union
    # of the window's mask frames, so every frame (and its mask) is cut alike.
    guide = _union(frame_masks) if frame_masks is not None else None
    state = rng.getstate()
    loaded = []
    for number, frame in enumerate(frames):
        draws = random.Random()
        draws.setstate(state)
        own = frame_masks[number] if frame_masks is not None else mask
        loaded.append(_load_image(frame, own, entry, planned, concept, draws, False, guide))
    pixels = torch.stack([one.pixels for one in loaded], dim=1)
    first = loaded[0]
    if frame_masks is None:
        return LoadedSample(pixels, first.mask, first.original_size, first.crop_offset)
    return LoadedSample(
        pixels, torch.stack([one.mask for one in loaded], dim=1), first.original_size, first.crop_offset
    )


def _decode(path, indexes: list[int]) -> list[Image.Image]:
    from onetrainer.data.video import decode_frames

    return decode_frames(path, indexes)


def _fit(mask: Image.Image, size: tuple[int, int]) -> Image.Image:
    return mask if mask.size == size else mask.resize(size, Image.Resampling.BILINEAR)


def _union(masks: list[Image.Image]) -> Image.Image:
    """The brightest value of each pixel over the masks: what any of them trains."""
    return Image.fromarray(np.max(np.stack([np.asarray(m) for m in masks]), axis=0).astype(np.uint8), "L")


def window_of(entry: ImageEntry, planned: PlannedSample, concept) -> list[int]:
    """The clip's source frame numbers this sample trains (what `load_sample` decodes), for the previews and tests."""
    from onetrainer.data.video import window_indexes

    rng = random.Random(hash_seed(concept.seed, planned.variation, _name_seed(entry.path.name), 5))
    return window_indexes(entry.clip, entry.frames, entry.window, concept, rng)


def _load_image(
    image, mask, entry, planned, concept, rng: random.Random, with_references: bool, guide=None
) -> LoadedSample:
    """One picture (an image, or a frame of a clip) scaled to cover the bucket, cropped and augmented by `rng`.
    `guide`: the mask the mask-driven crops are drawn on, where it is not `mask` itself (a mask clip's union)."""
    from onetrainer.data.image_augment import augment_image, circular_mask_shrink, random_mask_rotate_crop

    original = (image.height, image.width)
    settings = concept.image
    # OneTrainer's order: mask-driven crops first, then the bucket's scale and crop, then the augmentations.
    if guide is None:
        if mask is not None and settings.enable_random_circular_mask_shrink:
            mask = circular_mask_shrink(mask, rng)
        if mask is not None and settings.enable_random_mask_rotate_crop:
            image, mask = random_mask_rotate_crop(
                image, mask, rng, min_size=min(planned.bucket.width, planned.bucket.height)
            )
    else:
        if settings.enable_random_circular_mask_shrink:
            guide = circular_mask_shrink(guide, rng)  # the disc cut from the union; each frame's mask inside it
            mask = Image.fromarray(np.where(np.asarray(guide) > 0, np.asarray(mask), 0).astype(np.uint8), "L")
        if settings.enable_random_mask_rotate_crop:
            state, size = rng.getstate(), min(planned.bucket.width, planned.bucket.height)
            image, _ = random_mask_rotate_crop(image, guide, rng, min_size=size)
            again = random.Random()
            again.setstate(state)  # the same draws on the same guide: the mask turned and cut as the frame
            mask, _ = random_mask_rotate_crop(mask, guide, again, min_size=size)
    scaled, box = _scale_and_crop(image.size, planned, settings, rng)
    image = image.resize(scaled, Image.Resampling.BICUBIC).crop(box)
    if mask is not None:
        mask = mask.resize(scaled, Image.Resampling.BILINEAR).crop(box)
    # Before the augmentations draw: the references take the flip and rotation augment_image is about to draw.
    references = _moved_references(entry, scaled, box, settings, rng) if with_references else []
    image, mask = augment_image(image, mask, settings, rng)
    pixels = _to_tensor(image) * 2.0 - 1.0
    mask_tensor = _to_tensor(mask) if mask is not None else None
    return LoadedSample(pixels, mask_tensor, original, (box[1], box[0]), references)


def _moved_depth(entry: ImageEntry, size: tuple[int, int], mask, planned: PlannedSample, concept) -> torch.Tensor:
    """The image's depth map through the same steps as the image (`_load_image`), by the same draws (a generator in
    the image's starting state): at the image's size, the mask-driven crop, the bucket's scale and crop, the flip and
    rotation; no colour change."""
    from onetrainer.data.image_augment import (
        apply_geometry,
        augmentation_geometry,
        circular_mask_shrink,
        random_mask_rotate_crop,
    )

    depth = _open_depth(entry.depth)
    if depth.size != size:
        depth = depth.resize(size, Image.Resampling.BILINEAR)
    rng = image_rng(concept, planned, entry)
    settings = concept.image
    if mask is not None and settings.enable_random_circular_mask_shrink:
        mask = circular_mask_shrink(mask, rng)
    if mask is not None and settings.enable_random_mask_rotate_crop:
        depth, mask = random_mask_rotate_crop(
            depth, mask, rng, min_size=min(planned.bucket.width, planned.bucket.height)
        )
    scaled, box = _scale_and_crop(depth.size, planned, settings, rng)
    depth = depth.resize(scaled, Image.Resampling.BICUBIC).crop(box)  # the image's filter: its pixels line up
    depth, _ = apply_geometry(depth, None, *augmentation_geometry(settings, rng))
    return torch.from_numpy(np.asarray(depth, dtype=np.float32).copy())[None]


def _open_depth(path) -> Image.Image:
    """A depth map file as one float channel: 8- or 16-bit greyscale, or the mean of its colours."""
    with Image.open(path) as image:
        image.load()
        if image.mode in ("I", "I;16", "I;16B", "I;16L", "F"):
            return image.convert("F") if image.mode != "I;16" else Image.fromarray(np.asarray(image, np.float32))
        return image.convert("L").convert("F")


def load_references(entry: ImageEntry, planned: PlannedSample, concept) -> list[torch.Tensor]:
    """The sample's reference images exactly as `load_sample(..., with_mask=False, with_references=True)` gives them,
    without decoding the image itself: its crop and its flip and rotation follow from its size (the scan's) and the
    sample's random draws alone. For a step that reads the references with the caption while the image's latents come
    from the cache."""
    if not entry.references:
        return []
    rng = image_rng(concept, planned, entry)
    scaled, box = _scale_and_crop((entry.width, entry.height), planned, concept.image, rng)
    return _moved_references(entry, scaled, box, concept.image, rng)


def _scale_and_crop(size: tuple[int, int], planned: PlannedSample, settings, rng: random.Random):
    """The size an image of `size` (width, height) is scaled to, to cover the sample's bucket, and its crop box there
    (drawn from `rng` with crop jitter)."""
    from onetrainer.data.image_augment import crop_box

    bucket = planned.bucket
    scaled = cover_size(size[0], size[1], bucket)
    return scaled, crop_box(scaled, (bucket.width, bucket.height), settings.enable_crop_jitter, rng)


def _moved_references(entry: ImageEntry, scaled: tuple[int, int], box, settings, rng: random.Random) -> list:
    """The image's references moved as the image is: cropped by the same shares of their size as `box` of the image
    scaled to `scaled`, and flipped and turned as `augment_image` is about to draw from `rng` (read, not moved)."""
    from onetrainer.data.image_augment import augmentation_geometry

    if not entry.references:
        return []
    left, top, right, bottom = box
    share = (left / scaled[0], top / scaled[1], right / scaled[0], bottom / scaled[1])
    geometry = augmentation_geometry(settings, rng)
    return [_reference(path, share, geometry) for path in entry.references]


def _reference(path, share: tuple[float, float, float, float], geometry: tuple) -> torch.Tensor:
    """A reference image with the image's crop (as shares of its size) and its flip and rotation."""
    from onetrainer.data.image_augment import apply_geometry

    image = open_rgb(path)
    width, height = image.size
    box = (round(share[0] * width), round(share[1] * height), round(share[2] * width), round(share[3] * height))
    image, _ = apply_geometry(image.crop(box), None, *geometry)
    return _to_tensor(image) * 2.0 - 1.0


def caption_for(entry: ImageEntry, planned: PlannedSample, concept, text_variation: int) -> str:
    """The caption of this sample: one of its lines, then the concept's text augmentation."""
    from onetrainer.data.text_augment import augment_caption

    rng = random.Random(hash_seed(concept.seed, text_variation, planned.image, 4))
    line = rng.choice(entry.captions)
    return augment_caption(line, concept.text, rng)


def _to_tensor(image: Image.Image) -> torch.Tensor:
    array = np.asarray(image, dtype=np.float32) / 255.0
    if array.ndim == 2:
        array = array[:, :, None]
    return torch.from_numpy(array).permute(2, 0, 1).contiguous()
