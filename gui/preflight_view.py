"""The statistics tab's content, read from the preflight report (`onetrainer.data.preflight`): no Tk here."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PREFLIGHT_MISSING = "The statistics are not available yet (onetrainer.data.preflight is missing)."
LISTED_FILES = 5
BUCKET_HEADERS = ["Bucket", "Images", "Batches", "Repeated", "Dropped"]


@dataclass
class ConceptStatistics:
    facts: list[tuple[str, str]] = field(default_factory=list)  # (label, value)
    notes: list[str] = field(default_factory=list)  # files named by the report, problems, errors
    bucket_headers: list[str] = field(default_factory=list)
    bucket_rows: list[list[str]] = field(default_factory=list)
    bucket_labels: list[str] = field(default_factory=list)  # per bucket, for the chart
    bucket_images: list[float] = field(default_factory=list)  # images per bucket, for the chart


def _names(paths: list[str]) -> str:
    shown = ", ".join(Path(p).name for p in paths[:LISTED_FILES])
    return shown + (f" … and {len(paths) - LISTED_FILES} more" if len(paths) > LISTED_FILES else "")


def concept_statistics(report: Any, index: int, clips: Any = None) -> ConceptStatistics:
    """The facts, notes and bucket table of concept `index` (of the config's list), and the run's totals. `clips`: the
    concept's `concept_preview.ClipCensus` (its clips counted beside its images where it has any)."""
    stats = ConceptStatistics()
    entry = next((c for c in report.concepts if c.index == index), None)
    if entry is None:
        stats.notes.append("This concept is not in the report: it is disabled.")
    else:
        stats.facts += [
            ("Folder", entry.folder),
            ("Trained on", "yes" if entry.trained else "no (validation)"),
            ("Images found", str(entry.images - (clips.windows if clips is not None else 0))),
            *_clip_facts(clips),
            ("Held out for validation", str(len(entry.held_out))),
            ("Captions missing", str(len(entry.missing_captions))),
            ("Masks missing", str(len(entry.missing_masks))),
            ("Masks resized", str(len(entry.resized_masks))),
            *_reference_facts(entry),
            *_depth_facts(entry),
            ("Unreadable files", str(len(entry.unreadable))),
        ]
        for label, items in (
            ("Held out for validation (never trained)", entry.held_out),
            ("Captions missing (trained with an empty caption)", entry.missing_captions),
            ("Masks missing (trained whole)", entry.missing_masks),
            ("Reference images missing (skipped)", entry.missing_references),
            ("More reference images than the model takes (skipped)", entry.too_many_references),
            ("Masks of another size (resized)", entry.resized_masks),
            ("Clips need a video model type (skipped)", entry.clips_need_video),
        ):
            if items:
                stats.notes.append(f"{label}: {_names(items)}")
        stats.notes += [f"Short clip: {line}" for line in entry.short_clips]
        stats.notes += [f"Unreadable, skipped: {Path(path).name} ({reason})" for path, reason in entry.unreadable]
        named = {Path(path) for path, _ in entry.unreadable}  # a video model type's scan names its unreadable clips
        others = [(path, why) for path, why in (clips.unreadable if clips is not None else []) if path not in named]
        stats.notes += [f"Unreadable clip: {path.name} ({reason})" for path, reason in others]
        stats.notes += [f"Problem: {problem}" for problem in entry.problems]
        stats.notes += [f"Warning: {warning}" for warning in entry.warnings]
        if entry.buckets:
            stats.bucket_headers = list(BUCKET_HEADERS)
        for row in entry.buckets:
            counts = (row.images, row.batches, row.repeated, row.dropped)
            stats.bucket_rows.append([row.bucket, *(str(n) for n in counts)])
            stats.bucket_labels.append(row.bucket)
            stats.bucket_images.append(float(row.images))
    stats.facts += [
        ("Steps per epoch (all concepts)", str(report.steps_per_epoch)),
        ("Total steps (all concepts)", str(report.total_steps)),
    ]
    stats.notes += [f"Error: {error}" for error in report.errors]
    return stats


def _clip_facts(clips: Any) -> list[tuple[str, str]]:
    """The concept's clips (a `ClipCensus`): how many read, their frames and duration, the windows they give (the
    samples a video model type trains, which the report's entries count with the images), the unreadable ones."""
    if clips is None or not (clips.clips or clips.unreadable):
        return []
    from gui.concept_preview import duration_text

    facts = [
        ("Clips found", str(clips.clips)),
        ("Clip frames", str(clips.frames)),
        ("Clip duration", duration_text(clips.seconds)),
    ]
    if clips.windows:
        facts.append(("Clip windows (samples)", str(clips.windows)))
    return [*facts, ("Unreadable clips", str(len(clips.unreadable)))]


def _depth_facts(entry: Any) -> list[tuple[str, str]]:
    """A model type with a depth input: how many images bring their depth map file, how many the model estimates."""
    if entry.with_depth is None:
        return []
    estimated = entry.images - entry.with_depth
    return [("Images with a depth map file", str(entry.with_depth)), ("Depth maps to estimate", str(estimated))]


def _reference_facts(entry: Any) -> list[tuple[str, str]]:
    """How many images have reference images beside them and how many have none, where the concept has any or the
    model type needs them (its images without one are skipped)."""
    if not entry.with_references and not entry.missing_references:
        return []
    without = len(entry.missing_references) or entry.images - entry.with_references
    return [("Images with reference images", str(entry.with_references)), ("Images without any", str(without))]
