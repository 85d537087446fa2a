"""Video clips in concept folders: their headers, the frames each training sample takes, and decoding them.

A concept folder may hold clips (`VIDEO_EXTENSIONS`) beside its images, each with its caption file as an image has
(`<stem>.txt`, or the concept's prompt source). On a video model type (its family declares `FamilyInfo.video`, the
frame counts its VAE takes) a clip trains as one sample per window of frames and a still as a one-frame clip; on an
image model type the scan names the clips ("clips need a video model type") and skips them.

How a clip becomes windows, per concept (`ConceptVideoConfig`):
- its frames are first resampled to the concept's target rate by picking, for each instant 0, 1/fps, 2/fps, …, the
  frame shown then (`resampled_indexes`);
- the window length is the concept's frames per clip (else the run's `frames`) rounded down to a count the family's
  VAE takes (`FrameCounts.at_most`: 4k + 1 unless the family declares others); that is the clip's temporal bucket;
- windows are cut from the start (one), evenly spaced over the clip, or at random starts drawn again each epoch (from
  the concept's seed, the epoch or cache variation and the file name, as image augmentation is), at most
  `max_windows` of them (`window_starts`);
- a clip shorter than its bucket is named in the scan and, per `short_clips`, trained in the longest bucket it fills,
  padded to the bucket with its last frame, or skipped.

A clip's mask is either one picture for every frame (`<stem>-masklabel.png`, as an image's) or a mask clip
(`<stem>-masklabel.mp4`, or another of `VIDEO_EXTENSIONS`; `mask_clip_of`) of the same frame count: its frames are
resampled and windowed by the very indexes of the clip's (`window_indexes`), so each window's mask frames are those of
its frames (white = train, as an image's mask). A mask clip wins over a mask picture beside it. A mask clip whose
header counts other frames than its clip's is named in the scan (`ConceptScan.mismatched_mask_clips`) and not used:
the clip falls back to its mask picture if it has one, else it trains whole (as an image without a mask does). The loss
pools the mask frames into the latent frames (`noise/losses.latent_masks`).

The scan reads container headers only (frame count, rate, size: `clip_header`); frames are decoded when a sample is
loaded (`decode_frames`), with PyAV (FFmpeg's libraries in the `av` wheel, no system ffmpeg).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

from onetrainer.config.concept_config import CLIP_MODES
from onetrainer.config.family_info import FrameCounts

VIDEO_EXTENSIONS = (".mp4", ".webm", ".mov", ".mkv", ".gif")


def is_clip(path: Path) -> bool:
    from onetrainer.data.images import MASK_SUFFIX

    return path.suffix.lower() in VIDEO_EXTENSIONS and not path.stem.endswith(MASK_SUFFIX)


def list_clips(folder: Path, include_subdirectories: bool = False) -> list[Path]:
    pattern = folder.rglob("*") if include_subdirectories else folder.glob("*")
    return sorted(p for p in pattern if p.is_file() and is_clip(p))


def mask_clip_of(clip: Path) -> Path | None:
    """The clip's mask clip beside it (`<stem>-masklabel` with the clip's own extension first, then the others), or
    None."""
    from onetrainer.data.images import MASK_SUFFIX

    suffixes = [clip.suffix] + [ext for ext in VIDEO_EXTENSIONS if ext != clip.suffix.lower()]
    for suffix in suffixes:
        candidate = clip.with_name(f"{clip.stem}{MASK_SUFFIX}{suffix}")
        if candidate.is_file():
            return candidate
    return None


def is_mask_clip(path: Path) -> bool:
    return path.suffix.lower() in VIDEO_EXTENSIONS


@dataclass(frozen=True)
class ClipHeader:
    """What a clip's container header says: its frame count, frame rate and frame size (as stored)."""

    frames: int
    fps: float
    width: int
    height: int


class UnreadableClip(Exception):
    """A file the scan cannot use as a clip; its text says why."""


def clip_header(path: Path) -> ClipHeader:
    """The header of `path`'s first video stream, read without decoding a frame (a container without a frame count,
    as WebM and Matroska often are, counts its duration times its rate); UnreadableClip when it has none."""
    import av

    try:
        if path.stat().st_size == 0:
            raise UnreadableClip("the file is empty")
        with av.open(str(path)) as container:
            if not container.streams.video:
                raise UnreadableClip("no video stream")
            stream = container.streams.video[0]
            rate = stream.average_rate or stream.guessed_rate or stream.base_rate
            fps = float(rate) if rate else 0.0
            frames = int(stream.frames or 0)
            if frames <= 0 and fps > 0:
                if stream.duration is not None and stream.time_base is not None:
                    seconds = float(stream.duration * stream.time_base)
                else:
                    seconds = (container.duration or 0) / 1_000_000
                frames = round(seconds * fps)
            width, height = stream.codec_context.width, stream.codec_context.height
    except UnreadableClip:
        raise
    except (av.FFmpegError, OSError, ValueError, IndexError) as e:
        raise UnreadableClip(_reason(e)) from e
    if frames <= 0:
        raise UnreadableClip("the header gives no frame count")
    if width <= 0 or height <= 0:
        raise UnreadableClip("the header gives no frame size")
    return ClipHeader(frames, fps, width, height)


def _reason(error: Exception) -> str:
    text = str(error)
    if "Invalid data found" in text:
        return "not a video PyAV can read (damaged, or not the format its extension says)"
    return text or type(error).__name__


def resampled_indexes(frames: int, fps: float, target_fps: float) -> list[int]:
    """The source frame shown at each instant of the target rate (0, 1/target, 2/target, …) while the clip lasts:
    every frame when the target is 0 (or the rate unknown); a higher target repeats frames."""
    if target_fps <= 0 or fps <= 0:
        return list(range(frames))
    step = Fraction(fps).limit_denominator(100_000) / Fraction(target_fps).limit_denominator(100_000)
    count = math.ceil(frames / step)
    return [math.floor(i * step) for i in range(count) if math.floor(i * step) < frames]


def window_starts(length: int, window: int, mode: str, most: int, rng: random.Random | None = None) -> list[int]:
    """Where the windows of `window` frames start in a sequence of `length` (≥ window): START one at 0; EVEN up to
    `most` spread evenly from the first frame to the last; RANDOM up to `most` at starts drawn from `rng`. Never more
    windows than distinct starts."""
    room = length - window
    if room < 0:
        raise ValueError(f"a window of {window} frames does not fit {length}")
    count = 1 if mode == "START" else max(1, min(most, room + 1))
    if mode == "START":
        return [0]
    if mode == "EVEN":
        return [0] if count == 1 else [round(j * room / (count - 1)) for j in range(count)]
    if mode == "RANDOM":
        if rng is None:
            raise ValueError("random windows need a generator")
        return [rng.randint(0, room) for _ in range(count)]
    raise ValueError(f"unknown clip mode {mode!r}; expected one of {', '.join(CLIP_MODES)}")


@dataclass(frozen=True)
class VideoRule:
    """How the run's model type trains on clips: the frame counts its VAE takes and the run's frames per clip (a
    concept's own setting wins)."""

    counts: FrameCounts
    frames: int = 25
    label: str = "this model type"

    def wanted(self, concept) -> int:
        """The concept's window length: its frames per clip (else the run's), rounded down to a count the VAE takes."""
        frames = concept.video.frames or self.frames
        return max(self.counts.at_most(frames), self.counts.smallest)


@dataclass(frozen=True)
class ClipPlan:
    """What the scan decided for a clip: its temporal bucket (frames per sample), how many windows it gives, and, when
    it is shorter than the concept's bucket, how many frames it has at the target rate and what is done about it."""

    bucket: int  # frames per sample (0: skipped)
    windows: int
    length: int  # frames at the target rate
    short: str = ""  # "" when it fills its bucket; else "trained at N frames", "padded", "skipped"


def plan_clip(header: ClipHeader, concept, rule: VideoRule) -> ClipPlan:
    settings = concept.video
    length = len(resampled_indexes(header.frames, header.fps, settings.target_fps))
    wanted = rule.wanted(concept)
    if length >= wanted:
        return ClipPlan(wanted, _window_count(length, wanted, settings), length)
    if settings.short_clips == "PAD":
        return ClipPlan(wanted, 1, length, "padded with its last frame")
    shorter = rule.counts.at_most(length)
    if settings.short_clips == "SKIP" or shorter <= 0:
        return ClipPlan(0, 0, length, "skipped")
    return ClipPlan(shorter, _window_count(length, shorter, settings), length, f"trained at {shorter} frames")


def _window_count(length: int, window: int, settings) -> int:
    return 1 if settings.clip_mode == "START" else max(1, min(settings.max_windows, length - window + 1))


def window_indexes(header: ClipHeader, bucket: int, window: int, concept, rng: random.Random) -> list[int]:
    """The source frame indexes of window `window` of a clip in its bucket of `bucket` frames (the last frame repeated
    where the clip is shorter, which its plan allowed); RANDOM draws every window's start from `rng`, in order."""
    settings = concept.video
    indexes = resampled_indexes(header.frames, header.fps, settings.target_fps)
    if len(indexes) < bucket:
        return indexes + [indexes[-1]] * (bucket - len(indexes))
    starts = window_starts(len(indexes), bucket, settings.clip_mode, settings.max_windows, rng)
    start = starts[min(window, len(starts) - 1)]
    return indexes[start : start + bucket]


def _upright(frame):
    """A decoded frame as shown: turned by its display matrix (a phone's portrait clip is stored landscape and turned
    on playback), in degrees counterclockwise as PIL turns."""
    image = frame.to_image().convert("RGB")
    turn = round(frame.rotation or 0) % 360
    return image.rotate(turn, expand=True) if turn else image


SEEK_AFTER = 48  # a window starting this many frames in seeks to the keyframe before it rather than decode from 0


def decode_frames(path: Path, indexes: list[int]):
    """The frames at `indexes` (source frame numbers, repeats allowed) as RGB PIL images; ValueError naming the clip
    when it ends before the last (its header counted more frames). A window far into a clip (`SEEK_AFTER`) is found by
    seeking to the keyframe before it and numbering frames by their timestamps, where the clip has a constant rate and
    timestamps (not a GIF); otherwise, or when the seek does not give every frame, frames are decoded from the start."""
    import av

    wanted = set(indexes)
    try:
        found = _decode_seeking(path, wanted) if min(indexes) >= SEEK_AFTER else None
        if found is None:
            found, decoded = _decode_from_start(path, wanted)
            if max(indexes) not in found:
                raise ValueError(f"{path.name} ends after {decoded} frames; the sample needs frame {max(indexes) + 1}")
    except av.FFmpegError as e:
        raise ValueError(f"{path.name}: {_reason(e)}") from e
    return [found[i] for i in indexes]


def _decode_from_start(path: Path, wanted: set[int]) -> tuple[dict, int]:
    """The wanted frames by their decoding order, and how many frames were decoded."""
    import av

    last = max(wanted)
    found, decoded = {}, 0
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        for number, frame in enumerate(container.decode(stream)):
            decoded = number + 1
            if number in wanted:
                found[number] = _upright(frame)
            if number >= last:
                break
    return found, decoded


def _decode_seeking(path: Path, wanted: set[int]) -> dict | None:
    """The wanted frames after a seek, numbered by timestamp (start time, time base and the average rate); None where
    that numbering cannot be trusted or a wanted frame did not come, so the caller decodes from the start."""
    import av

    if path.suffix.lower() == ".gif":  # a GIF's frames each have their own delay: no constant rate to number them by
        return None
    first, last = min(wanted), max(wanted)
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        rate, base = stream.average_rate, stream.time_base
        if not rate or not base or stream.guessed_rate != rate:
            return None
        start = stream.start_time or 0
        container.seek(start + int(Fraction(first) / rate / base), stream=stream, backward=True)
        found = {}
        for frame in container.decode(stream):
            if frame.pts is None:
                return None
            number = round((frame.pts - start) * base * rate)
            if number > last:
                break
            if number in wanted:
                found[number] = _upright(frame)
    return found if len(found) == len(wanted) else None


@dataclass
class ClipCensus:
    """A concept's clips counted from their headers: the readable ones with their frames and seconds (a clip without
    a rate adds none), the windows they give on a video model type (the scan's samples from clips; 0 on an image
    one), and the unreadable ones named with why. The app's statistics and the CLI's preflight report show it."""

    clips: int = 0
    frames: int = 0
    seconds: float = 0.0
    windows: int = 0
    unreadable: list[tuple[Path, str]] = field(default_factory=list)

    def text(self) -> str:
        """One line: "3 clips, 51 frames, 6.4 s, 3 windows (samples)" (no windows on an image model type)."""
        parts = [_plural(self.clips, "clip"), _plural(self.frames, "frame"), duration_text(self.seconds)]
        if self.windows:
            parts.append(f"{_plural(self.windows, 'window')} (samples)")
        return ", ".join(parts)


def clip_census(folder: Path, concept, rule: VideoRule | None = None) -> ClipCensus:
    """The census of the clips in `folder` (as the scan lists them, with the concept's `include_subdirectories`) under
    the model type's `rule` (None: an image model type, no windows); reads headers only."""
    census = ClipCensus()
    if not folder.is_dir():
        return census
    for path in list_clips(folder, concept.include_subdirectories):
        try:
            header = clip_header(path)
        except UnreadableClip as e:
            census.unreadable.append((path, str(e)))
            continue
        census.clips += 1
        census.frames += header.frames
        census.seconds += header.frames / header.fps if header.fps > 0 else 0.0
        if rule is not None:
            census.windows += plan_clip(header, concept, rule).windows
    return census


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def duration_text(seconds: float) -> str:
    """Seconds as a person reads them: 4.2 s, 3 min 05 s, 1 h 02 min."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    whole = round(seconds)
    if whole < 3600:
        return f"{whole // 60} min {whole % 60:02d} s"
    return f"{whole // 3600} h {whole % 3600 // 60:02d} min"
