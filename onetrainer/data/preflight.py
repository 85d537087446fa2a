"""The preflight report: what a run will train, before anything loads.

Per concept: the images found, captions missing, masks missing or resized, unreadable files (named), the bucket table
(size, images, batches, images repeated to fill batches or dropped); the steps per epoch and in total; what will be
cached. `scripts/train.py --preflight` prints it; the GUI shows it in the concept window.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from onetrainer.config.model_types import model_type_info
from onetrainer.data.scan import CLIPS_NEED_VIDEO
from onetrainer.data.training_data import DatasetError, TrainingData
from onetrainer.data.video import ClipCensus, clip_census

if TYPE_CHECKING:
    from onetrainer.config import TrainConfig


@dataclass
class BucketRow:
    bucket: str  # "WIDTHxHEIGHT"
    images: int
    batches: int  # batches holding this concept's images (a batch may also hold other concepts' of the bucket)
    repeated: int  # filler samples added to complete batches
    dropped: int  # samples left out (drop_incomplete_batches)


@dataclass
class ConceptReport:
    index: int  # into config.concepts
    name: str
    folder: str
    trained: bool
    images: int
    unreadable: list[tuple[str, str]] = field(default_factory=list)
    missing_captions: list[str] = field(default_factory=list)
    missing_masks: list[str] = field(default_factory=list)
    missing_references: list[str] = field(default_factory=list)  # skipped: the model type needs references
    too_many_references: list[str] = field(default_factory=list)  # skipped: more than the model type takes
    with_references: int = 0  # images with reference images beside them (edit models learn from them)
    # a model type with a depth input: the images with a depth map file beside them (the others' is estimated)
    with_depth: int | None = None
    resized_masks: list[str] = field(default_factory=list)
    clips_need_video: list[str] = field(default_factory=list)  # skipped: the model type trains images
    short_clips: list[str] = field(default_factory=list)  # "clip: N frames of M: what was done"
    # mask clips not used, as their frame count is not their clip's: "mask clip: N frames, its clip M"
    mismatched_mask_clips: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # long captions, tiny images, non-UTF-8 captions
    buckets: list[BucketRow] = field(default_factory=list)
    held_out: list[str] = field(default_factory=list)  # images set aside for validation (`validation_holdout`)
    # the concept's clips counted from their headers (`video.clip_census`, as the app's statistics count them): clips,
    # frames, duration, the windows they give on a video model type (among `images`), the unreadable ones
    clips: ClipCensus = field(default_factory=ClipCensus)


@dataclass
class PreflightReport:
    concepts: list[ConceptReport]
    steps_per_epoch: int = 0
    total_steps: int = 0
    fillers: list[str] = field(default_factory=list)  # image files repeated to fill a batch (epoch 1)
    dropped: list[str] = field(default_factory=list)  # image files left out of a batch (epoch 1)
    cached_latents: int = 0  # image variations already in the cache
    latents_to_encode: int = 0
    text_cached: bool = False  # the text encoders are frozen, so their outputs will be cached (not: are cached now)
    errors: list[str] = field(default_factory=list)

    def text(self) -> str:
        lines = []
        for c in self.concepts:
            kind = "" if c.trained else " (validation)"
            lines.append(f"Concept '{c.name}'{kind}: {c.folder}")
            held = f" ({len(c.held_out)} held out for validation, not trained: {_names(c.held_out)})"
            # `images` counts each clip window as a sample: the images line counts the images (and stills) alone
            lines.append(f"  images: {c.images - c.clips.windows}" + (held if c.held_out else ""))
            if c.clips.clips or c.clips.unreadable:
                lines.append(f"  clips: {c.clips.text()}")
            named = {path for path, _ in c.unreadable}  # a video model type's scan names its unreadable clips
            for path, reason in c.clips.unreadable:
                if str(path) not in named:
                    lines.append(f"  unreadable clip: {path} ({reason})")
            if c.with_depth is not None:
                estimated = c.images - c.with_depth
                lines.append(
                    f"  depth maps: {c.with_depth} from -depth.png files, {estimated} by the model's depth estimator"
                )
            for label, items in (
                ("captions missing (trained with an empty caption)", c.missing_captions),
                ("masks missing (trained whole)", c.missing_masks),
                ("reference images missing (skipped)", c.missing_references),
                ("more reference images than the model takes (skipped)", c.too_many_references),
                ("masks of another size (resized)", c.resized_masks),
                (f"{CLIPS_NEED_VIDEO} (skipped)", c.clips_need_video),
            ):
                if items:
                    lines.append(f"  {label}: {len(items)}: {_names(items)}")
            for line in c.short_clips:
                lines.append(f"  short clip: {line}")
            for line in c.mismatched_mask_clips:
                lines.append(f"  mask clip not used (frame counts differ; its mask picture, else none): {line}")
            for path, reason in c.unreadable:
                lines.append(f"  unreadable, skipped: {path} ({reason})")
            for problem in c.problems:
                lines.append(f"  problem: {problem}")
            for warning in c.warnings:
                lines.append(f"  warning: {warning}")
            if c.buckets:
                lines.append("  bucket        images  batches  repeated  dropped")
                for b in c.buckets:
                    lines.append(f"  {b.bucket:<12}{b.images:>7}{b.batches:>9}{b.repeated:>10}{b.dropped:>9}")
        lines.append(f"Steps per epoch: {self.steps_per_epoch}; total steps: {self.total_steps}")
        if self.fillers:
            lines.append(f"Repeated to fill batches (epoch 1): {_names(self.fillers)}")
        if self.dropped:
            lines.append(f"Dropped (drop_incomplete_batches, epoch 1): {_names(self.dropped)}")
        if self.cached_latents or self.latents_to_encode:
            lines.append(self.latent_cache_text())
        lines.append("Text-encoder outputs: " + self.text_cache_text())
        lines += [f"error: {e}" for e in self.errors]
        return "\n".join(lines)

    def latent_cache_text(self) -> str:
        """What the latent cache holds now (nothing is called cached before it is)."""
        total = self.cached_latents + self.latents_to_encode
        if not self.cached_latents:
            return f"Latent cache: nothing cached yet; {total} image variations are encoded at the start"
        cached, missing = self.cached_latents, self.latents_to_encode
        return f"Latent cache: {cached} of {total} image variations cached, {missing} to encode"

    def text_cache_text(self) -> str:
        if self.text_cached:
            return "encoded once at the start and cached (the text encoders are frozen)"
        return "computed every step (a text encoder is trained)"


def _names(paths: list[str], limit: int = 8) -> str:
    shown = ", ".join(Path(p).name for p in paths[:limit])
    return shown + (f" … and {len(paths) - limit} more" if len(paths) > limit else "")


def preflight_report(config: TrainConfig, resolve=None) -> PreflightReport:
    """The report for `config` (packed: concepts inline). Reads image headers only; loads no model.

    `resolve` turns a concept path into a folder; by default `families.sources.resolve_local`, which also builds
    the folder a registered source's name stands for (the demo's images).
    """
    if resolve is None:
        from onetrainer.families.sources import resolve_local as resolve
    step = model_type_info(config.model_type).family.bucket_step
    try:
        data = TrainingData(config, step, resolve)
    except DatasetError as e:
        from onetrainer.data.scan import scan_concepts

        try:
            scans = scan_concepts(config, resolve)
        except ValueError:  # the run's frames per clip is not a count: the error says so
            scans = []
        report = PreflightReport([_concept_report(s, None, None, config) for s in scans])
        report.errors.append(str(e))
        return report
    plan = data.plan(0)
    samples_by_concept: dict[int, list] = defaultdict(list)
    for sample in [s for batch in plan.batches for s in batch] + plan.dropped:
        samples_by_concept[data.images[sample.image].concept].append(sample)
    # Per concept: the batches that hold its images, not every concept's batches of the bucket.
    batches_per_bucket = Counter(
        (concept, str(batch[0].bucket))
        for batch in plan.batches
        for concept in {data.images[s.image].concept for s in batch}
    )
    report = PreflightReport(
        [_concept_report(s, data, samples_by_concept.get(s.index, []), config) for s in data.scans],
        steps_per_epoch=data.steps_in_epoch(0),
        total_steps=data.total_steps(),
        fillers=[str(data.images[i].path) for i in plan.fillers],
        dropped=[str(data.images[s.image].path) for s in plan.dropped],
    )
    dropped = Counter((data.images[s.image].concept, str(s.bucket)) for s in plan.dropped)
    for scan, concept in zip(data.scans, report.concepts):
        for row in concept.buckets:
            row.batches = batches_per_bucket.get((scan.index, row.bucket), 0)
            row.dropped = dropped.get((scan.index, row.bucket), 0)
    if config.latent_caching:
        _count_cache(report, data, config)
    return report


def _concept_report(scan, data: TrainingData | None, samples: list | None, config=None) -> ConceptReport:
    report = ConceptReport(
        index=scan.index,
        name=scan.name,
        folder=str(scan.folder),
        trained=scan.kind.value != "VALIDATION",
        images=len(scan.images),
        unreadable=[(str(p), r) for p, r in scan.unreadable],
        missing_captions=[str(p) for p in scan.missing_captions],
        missing_masks=[str(p) for p in scan.missing_masks],
        missing_references=[str(p) for p in scan.missing_references],
        too_many_references=[str(p) for p, _ in scan.too_many_references],
        with_references=sum(1 for e in scan.images if e.references),
        with_depth=sum(1 for e in scan.images if e.depth is not None) if data is not None and data.with_depth else None,
        resized_masks=[str(p) for p in scan.resized_masks],
        clips_need_video=[str(p) for p in scan.clips_need_video],
        short_clips=[f"{p.name}: {n} frames of {wanted}, {done}" for p, n, wanted, done in scan.short_clips],
        mismatched_mask_clips=[f"{p.name}: {n} frames, its clip {m}" for p, n, m in scan.mismatched_mask_clips],
        problems=list(scan.problems),
        warnings=[*scan.caption_warnings, *scan.image_warnings],
        held_out=[str(e.path) for e in data.held_out.get(scan.index, [])] if data is not None else [],
    )
    if config is not None:
        report.clips = clip_census(scan.folder, config.concepts[scan.index], _video_rule(config))
    if samples:
        by_bucket: dict[str, list] = defaultdict(list)
        for sample in samples:
            by_bucket[str(sample.bucket)].append(sample)
        for bucket, items in sorted(by_bucket.items()):
            real = {s.image for s in items if not s.filler}
            report.buckets.append(BucketRow(bucket, len(real), 0, sum(1 for s in items if s.filler), 0))
    return report


def _video_rule(config: TrainConfig):
    """The model type's clip rule (`scan.video_rule`); None where the frames per clip is not a count (the report's
    error names it) or the model type trains images."""
    from onetrainer.data.scan import video_rule

    try:
        return video_rule(config)
    except ValueError:
        return None


def _count_cache(report: PreflightReport, data: TrainingData, config: TrainConfig) -> None:
    from onetrainer.data.cache import DiskCache
    from onetrainer.data.caching import latent_identity, needed_samples, text_encoders_frozen
    from onetrainer.families import load_family_class

    data.latent_key_base = latent_identity(config, load_family_class(config.model_type).part_roles)
    with_masks = config.masked_training or model_type_info(config.model_type).inpainting
    cache = DiskCache(config.cache_dir, "latents")
    keys = needed_samples(data, config, with_masks)
    report.cached_latents = sum(1 for k in keys if k in cache)
    report.latents_to_encode = len(keys) - report.cached_latents
    report.text_cached = text_encoders_frozen(config)
