"""Filling the cache before training: encode every image variation and caption the run will use that is not cached.

Encoding is batched (one bucket at a time) and reports its progress after each entry it writes, which is also where the
caller can end it (a stop): every entry written so far stays in the cache. An image that cannot be decoded is reported
by name and left out of the run.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from onetrainer.data.cache import DiskCache, cache_key, model_identity
from onetrainer.data.plan import PlannedSample
from onetrainer.data.samples import caption_for, load_sample
from onetrainer.data.training_data import EXTRA_PREFIX, TrainingData, cached_mask, stack_masks
from onetrainer.families.base import Conditioning, PartRole

if TYPE_CHECKING:
    from onetrainer.config import TrainConfig

ENCODE_BATCH = 4
CACHE_LAYOUT = 2  # 2: named family extras and text tensors (entries of older layouts are encoded again)


# `report(kind, done, total)`: a pass's progress ("latents" or "captions"), when it starts (done 0) and after each entry
# it writes or finds undecodable; it may raise to end the pass there.
CacheReport = Callable[[str, int, int], None]


@dataclass
class CacheStats:
    needed: int = 0
    encoded: int = 0
    seconds: float = 0.0
    failed: list[str] = None  # type: ignore[assignment]

    @property
    def per_second(self) -> float:
        return self.encoded / self.seconds if self.seconds > 0 else 0.0


def latent_identity(config: TrainConfig, part_roles: Mapping[str, PartRole]) -> dict:
    """What the latents of a run depend on besides the image: the model type and the parts that encode images (the
    family's IMAGE_ENCODER parts: a VAE, an EfficientNet encoder, …), each with its source and dtype."""
    from onetrainer.config.model_types import model_type_info

    info = model_type_info(config.model_type)
    identity = {"kind": "latents", "layout": CACHE_LAYOUT, "family": info.family.key, "inpainting": info.inpainting}
    for part in sorted(p for p, role in part_roles.items() if role is PartRole.IMAGE_ENCODER):
        identity.update(model_identity(config, part))
    return identity


def fill_latent_cache(
    data: TrainingData, family, model, config: TrainConfig, with_masks: bool, report: CacheReport, ranks=None
) -> CacheStats:
    """Encode what the run needs and the cache lacks; afterwards `data` reads its batches from the cache.

    `ranks` (a `training.distributed.Distributed`, several processes): each rank encodes every N-th missing entry, so
    no two ranks write one entry, and all wait for each other before training reads the cache."""
    data.latent_cache = DiskCache(config.cache_dir, "latents")
    data.latent_key_base = latent_identity(config, family.part_roles)
    stats = CacheStats(failed=[])
    started = time.monotonic()
    while True:
        needed = needed_samples(data, config, with_masks)
        missing = [(k, s) for k, s in needed.items() if k not in data.latent_cache] if needed else []
        stats.needed = len(needed)
        if ranks is not None:
            # Every rank has listed what is missing before any writes: a rank that ran ahead and wrote entries would
            # shorten a slower rank's list, and the ranks' every-N-th slices would then skip entries or repeat them.
            ranks.barrier()
            missing = missing[ranks.rank :: ranks.world_size]
        failed = _encode_latents(data, family, model, missing, with_masks, report, stats)
        if ranks is not None:
            ranks.barrier()
            failed = {i: reason for part in ranks.all_gather_object(failed) for i, reason in part.items()}
        if not failed:
            break
        # Leave out the images that cannot be decoded and plan again without them.
        stats.failed += [f"{data.images[i].path}: {reason}" for i, reason in failed.items()]
        data.leave_out(failed)
        if not data.images:
            break
    stats.seconds = time.monotonic() - started
    return stats


def needed_samples(data: TrainingData, config: TrainConfig, masked: bool) -> dict[str, PlannedSample]:
    """Every image variation the run's epochs use, by cache key."""
    needed: dict[str, PlannedSample] = {}
    for epoch in range(config.epochs):
        for batch in data.plan(epoch).batches:
            for sample in batch:
                plain = PlannedSample(sample.image, sample.bucket, sample.variation)
                needed.setdefault(data.latent_key(plain, masked), plain)
    return needed


def _encode_latents(data, family, model, missing, with_masks, report: CacheReport, stats) -> dict[int, str]:
    by_bucket: dict = defaultdict(list)
    for key, sample in missing:
        by_bucket[sample.bucket].append((key, sample))
    failed: dict[int, str] = {}
    done = 0
    if missing:
        report("latents", done, len(missing))
    for items in by_bucket.values():
        for start in range(0, len(items), ENCODE_BATCH):
            chunk = items[start : start + ENCODE_BATCH]
            loaded, keys = [], []
            for key, sample in chunk:
                try:
                    image, concept = data.images[sample.image], data.concept(sample)
                    loaded.append(
                        load_sample(image, sample, concept, with_masks, data.with_references, data.with_depth)
                    )
                    keys.append(key)
                except (OSError, ValueError, SyntaxError) as e:
                    failed[sample.image] = f"cannot be decoded ({e})"
                    done += 1
                    report("latents", done, len(missing))
            if not loaded:
                continue
            pixels = torch.stack([s.pixels for s in loaded])
            with torch.no_grad():
                latents = family.encode_images(model, pixels).float().cpu()
                masks = stack_masks([s.mask for s in loaded]) if with_masks else None
                if data.with_depth:
                    extra = family.cache_extras(model, pixels, masks, depths=[s.depth for s in loaded])
                else:
                    extra = family.cache_extras(model, pixels, masks)
            for i, (key, sample) in enumerate(zip(keys, loaded)):
                entry = {
                    "latents": latents[i],
                    "original_size": torch.tensor(sample.original_size),
                    "crop_offset": torch.tensor(sample.crop_offset),
                }
                if with_masks:
                    entry["mask"] = cached_mask(sample.mask)
                entry.update({EXTRA_PREFIX + name: value[i].cpu() for name, value in extra.items()})
                if data.with_references and sample.references:  # none: a plain text-to-image sample
                    with torch.no_grad():
                        own = family.encode_references(model, sample.references)
                    entry.update({EXTRA_PREFIX + name: value.cpu() for name, value in own.items()})
                data.latent_cache.put(key, entry)
                stats.encoded += 1
                done += 1
                report("latents", done, len(missing))
    return failed


# -- text ---------------------------------------------------------------------------------------------------------


def text_encoders_frozen(config: TrainConfig) -> bool:
    """Text-encoder outputs can be cached when no text encoder (nor adapter on it) and no embedding trains."""
    from onetrainer.config.enums import TrainingMethod
    from onetrainer.config.model_types import model_type_info

    if config.training_method is TrainingMethod.EMBEDDING or any(e.train for e in config.additional_embeddings):
        return False
    family = model_type_info(config.model_type).family
    encoders = family.parts_with(PartRole.TEXT_ENCODER)
    return not any(config.part(p).train for p in encoders)


class TextCache:
    """Text-encoder outputs by caption, for runs whose text encoders are frozen. A family that reads reference images
    with the caption (an edit model) has an entry per caption and references (`TrainingData.reference_key`)."""

    def __init__(self, config: TrainConfig, family, model) -> None:
        self.cache = DiskCache(config.cache_dir, "text")
        self.family, self.model = family, model
        self.identity = {
            "kind": "text",
            "layout": CACHE_LAYOUT,
            "family": family.info.key,
            "skips": [slot.layer_skip for slot in model.text_encoders],
            "lengths": [slot.max_tokens for slot in model.text_encoders],
            **{k: v for slot in model.text_encoders for k, v in model_identity(config, slot.part).items()},
        }
        self._keys: dict[tuple[str, str | None], str] = {}

    def key(self, caption: str, references: str | None = None) -> str:
        """The entry's key (remembered: every step asks again for its batch's captions)."""
        key = self._keys.get((caption, references))
        if key is None:
            parts = {**self.identity, "caption": caption}
            if references is not None:
                parts["references"] = references
            key = self._keys[caption, references] = cache_key(parts)
        return key

    def conditioning(
        self,
        captions: list[str],
        device,
        reference_keys: list[str] | None = None,
        references: Callable[[], list[list[torch.Tensor]]] | None = None,
    ) -> Conditioning:
        """The captions' conditioning; with `reference_keys` (one per caption), that of each caption with its
        sample's references, which `references` decodes should an entry be missing."""
        keys = [self.key(c, r) for c, r in zip(captions, reference_keys or [None] * len(captions))]
        entries = [self.cache.get(k) for k in keys]
        missing = {k: i for i, (k, e) in enumerate(zip(keys, entries)) if e is None}
        if missing:  # damaged, deleted meanwhile (another run cleared the cache) or never cached: encode and repair
            rows = list(missing.values())
            pictures = None
            if reference_keys is not None:
                decoded = references()
                pictures = [decoded[i] for i in rows]
            encoded = dict(
                zip(missing, encode_text_entries(self.family, self.model, [captions[i] for i in rows], pictures))
            )
            for key, entry in encoded.items():
                self.cache.put(key, entry)
            entries = [e if e is not None else encoded[k] for k, e in zip(keys, entries)]
        return Conditioning.stack(entries, device)


def encode_text_entries(
    family, model, captions: list[str], references: list[list[torch.Tensor]] | None = None
) -> list[dict[str, torch.Tensor]]:
    """The text cache's entries of `captions` (with each one's reference images, for a family that reads them): each
    caption's named tensors, float32 on the CPU."""
    with torch.no_grad():
        if references is None:
            conditioning = family.encode_text(model, captions)
        else:
            conditioning = family.encode_text(model, captions, references=references)
    return [family.text_cache_row(conditioning, i) for i in range(len(captions))]


def fill_text_cache(
    data: TrainingData, family, model, config: TrainConfig, apply_embeddings, report: CacheReport, ranks=None
) -> tuple[TextCache, CacheStats]:
    """Encode every caption the run uses that the cache lacks. A family that reads reference images with the caption
    gets an entry per caption and sample: each sample's references are decoded once and its captions encoded
    together; other captions are encoded 16 at a time."""
    text_cache = TextCache(config, family, model)
    stats = CacheStats(failed=[])
    started = time.monotonic()
    needed = _needed_texts(data, text_cache, config, apply_embeddings)
    stats.needed = len(needed)
    missing = sorted(k for k in needed if k not in text_cache.cache)
    if ranks is not None:  # each rank encodes every N-th entry of the same list; all meet before training reads
        ranks.barrier()  # every rank has listed the missing entries before any writes (see fill_latent_cache)
        missing = missing[ranks.rank :: ranks.world_size]
    if missing:
        report("captions", 0, len(missing))
    for keys in _encoding_groups(data, needed, missing):
        pictures = None
        if data.text_with_references:  # a group is one sample's captions
            (references,) = data.load_references([needed[keys[0]][1]])
            pictures = [references] * len(keys)
        for key, entry in zip(keys, encode_text_entries(family, model, [needed[k][0] for k in keys], pictures)):
            text_cache.cache.put(key, entry)
            stats.encoded += 1
            report("captions", stats.encoded, len(missing))
    if ranks is not None:
        ranks.barrier()
    stats.seconds = time.monotonic() - started
    return text_cache, stats


def _needed_texts(data: TrainingData, text_cache: TextCache, config, apply_embeddings) -> dict:
    """Every caption the run's epochs use, by text-cache key: (caption, None), or (caption, its sample) where the
    family reads the sample's references with it. The empty caption, which caption dropout trains with, is there
    too (for a reference family with each sample, where dropout is on)."""
    with_references = data.text_with_references
    dropout = any(config.part(slot.part).dropout_probability > 0 for slot in text_cache.model.text_encoders)
    needed: dict[str, tuple[str, PlannedSample | None]] = {}
    if not with_references:
        needed[text_cache.key("")] = ("", None)
    seen: set[tuple] = set()
    for epoch in range(config.epochs):
        for batch in data.plan(epoch).batches:
            for sample in batch:
                plain = PlannedSample(sample.image, sample.bucket, sample.variation)
                variation = data.text_variation(sample, epoch, True)
                seen_as = (plain, variation) if with_references else (sample.image, variation)
                if seen_as in seen:
                    continue
                seen.add(seen_as)
                entry = data.images[sample.image]
                caption = apply_embeddings(caption_for(entry, sample, data.concept(sample), variation))
                if not with_references:
                    needed.setdefault(text_cache.key(caption), (caption, None))
                    continue
                references = data.reference_key(plain)
                for text in (caption, "") if dropout else (caption,):
                    needed.setdefault(text_cache.key(text, references), (text, plain))
    return needed


def _encoding_groups(data: TrainingData, needed: dict, missing: list[str]) -> list[list[str]]:
    """The missing keys in groups encoded together: 16 captions, or one sample's captions (its references)."""
    if not data.text_with_references:
        return [missing[start : start + 16] for start in range(0, len(missing), 16)]
    by_sample: dict[str, list[str]] = defaultdict(list)
    for key in missing:
        by_sample[data.reference_key(needed[key][1])].append(key)
    return list(by_sample.values())
