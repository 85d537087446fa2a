"""What the concept window previews: a concept's images and clips, their captions and masks, their augmented versions,
and what each clip gives under the concept's video settings.

No Tk here. The augmentation functions live in `onetrainer.data` and are imported when a preview is made; when they
are missing the preview says so instead of failing.
"""

from __future__ import annotations

import contextlib
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PIL import Image

from onetrainer.config import ConceptConfig
from onetrainer.data.images import (
    caption_lines,
    list_images,
    mask_path_of,
    open_mask,
    open_rgb,
    read_text,
    reference_paths_of,
)
from onetrainer.data.scan import CLIPS_NEED_VIDEO, FirstUsable, ReferenceRule, first_usable_image
from onetrainer.data.video import (
    ClipCensus,
    ClipHeader,
    UnreadableClip,
    VideoRule,
    clip_header,
    is_clip,
    list_clips,
    mask_clip_of,
)
from onetrainer.data.video import (
    duration_text as duration_text,  # re-exported: the statistics show durations as the preflight does
)

IMAGE_AUGMENT_MISSING = "The augmentation preview is not available yet (onetrainer.data.image_augment is missing)."
TEXT_AUGMENT_MISSING = "The caption preview is not available yet (onetrainer.data.text_augment is missing)."


def concept_folder(path: str) -> Path:
    """The folder a concept's `path` names (a registered source's name, such as the demo's `tiny:images`, is the
    folder it builds)."""
    from onetrainer.families.sources import resolve_local  # no torch

    try:
        return resolve_local(path.strip())
    except Exception:  # a name its source does not know: shown as a folder that does not exist
        return Path(path)


def concept_images(concept: ConceptConfig) -> list[Path]:
    """The concept's training images (empty when its folder does not exist)."""
    if not concept.path.strip():
        return []
    folder = concept_folder(concept.path)
    if not folder.is_dir():
        return []
    return list_images(folder, concept.include_subdirectories)


def concept_items(concept: ConceptConfig) -> list[Path]:
    """The concept's images and clips in the order the scan walks them (empty when its folder does not exist)."""
    if not concept.path.strip():
        return []
    folder = concept_folder(concept.path)
    if not folder.is_dir():
        return []
    return sorted(
        list_images(folder, concept.include_subdirectories) + list_clips(folder, concept.include_subdirectories)
    )


def first_image(
    concept: ConceptConfig, references: ReferenceRule | None = None, video: VideoRule | None = None
) -> FirstUsable | None:
    """The first image (or, on a video model type, clip) of the concept's folder that trains (its card's thumbnail),
    in the order the trainer lists them, with the files passed over; None without a folder. `references`: how the
    model type trains on reference images (`scan.reference_rule`); `video`: how it trains on clips (`clip_rule`)."""
    if not concept.path.strip():
        return None
    folder = concept_folder(concept.path)
    if not folder.is_dir():
        return None
    return first_usable_image(folder, concept.include_subdirectories, references, video)


def captions_of(image: Path, concept: ConceptConfig) -> list[str]:
    """The caption lines the trainer would choose from for this image, following the concept's prompt source."""
    source = concept.text.prompt_source
    if source == "filename":
        return [image.stem]
    if source == "concept":
        path = Path(concept.text.prompt_path) if concept.text.prompt_path else None
        return caption_lines(read_text(path)) if path is not None and path.is_file() else []
    caption_file = image.with_suffix(".txt")
    return caption_lines(read_text(caption_file)) if caption_file.is_file() else []


@dataclass
class AugmentedImage:
    image: Image.Image
    mask: Image.Image | None  # None: the image has no mask file (everything trains)
    note: str = ""  # why the preview is incomplete, if it is
    references: list[Path] = field(default_factory=list)  # its reference images (`<stem>-reference[-N].<ext>`)


def augmented_image(image_path: Path, concept: ConceptConfig, seed: int) -> AugmentedImage:
    """The image and its mask as one epoch's augmentation would make them for this seed (a clip: its first frame, and
    its mask clip's first frame where it has one that reads, else its mask picture)."""
    image = clip_frame(image_path, 0) if is_clip(image_path) else open_rgb(image_path)
    references = list(reference_paths_of(image_path))
    mask_path = mask_path_of(image_path)
    mask = open_mask(mask_path) if mask_path.is_file() else None
    mask_clip = mask_clip_of(image_path) if is_clip(image_path) else None
    if mask_clip is not None:
        with contextlib.suppress(UnreadableClip):  # the scan names it; the preview shows the mask picture instead
            mask = clip_frame(mask_clip, 0).convert("L")
    if mask is not None and mask.size != image.size:
        mask = mask.resize(image.size, Image.Resampling.NEAREST)
    try:
        from onetrainer.data.image_augment import augment_image
    except ImportError:
        return AugmentedImage(image, mask, IMAGE_AUGMENT_MISSING, references)
    augmented, augmented_mask = augment_image(image, mask, concept.image, random.Random(seed))
    return AugmentedImage(augmented, augmented_mask, references=references)


def augmented_captions(captions: list[str], concept: ConceptConfig, seed: int, count: int = 3) -> tuple[list[str], str]:
    """`count` captions as the text augmentation would make them (each from a random line), and a note if any."""
    if not captions:
        return [], ""
    try:
        from onetrainer.data.text_augment import augment_caption
    except ImportError:
        return [], TEXT_AUGMENT_MISSING
    rng = random.Random(seed)
    return [augment_caption(rng.choice(captions), concept.text, rng) for _ in range(count)], ""


# -- clips -------------------------------------------------------------------------------------------------------

CLIP_MODE_WORDS = {  # how the windows are cut (`ConceptVideoConfig.clip_mode`), as the preview says it
    "START": "from the first frame",
    "EVEN": "spread evenly over the clip",
    "RANDOM": "at random starts drawn again each epoch",
}


def clip_frame(path: Path, index: int) -> Image.Image:
    """Frame `index` of the clip at `path`, upright as it is shown; UnreadableClip saying why when it cannot be
    decoded (a damaged file, or one that ends before its header said)."""
    return clip_frame_run(path, [index])[0]


def clip_rule(config: Any) -> tuple[VideoRule | None, str]:
    """How the config's model type trains on clips (`scan.video_rule`; None: an image model type) and, when the
    training's frames per clip is not a count, the error naming it (then no rule)."""
    from onetrainer.data import scan

    try:
        return scan.video_rule(config), ""
    except ValueError as e:
        return None, str(e)


def clip_facts(header: ClipHeader) -> str:
    """A clip's frames, duration, rate and size, as its header gives them."""
    seconds = f"{header.frames / header.fps:.2f} s" if header.fps > 0 else "duration unknown"
    fps = f"{header.fps:.3g} fps" if header.fps > 0 else "rate unknown"
    return f"{header.frames} frames · {seconds} · {fps} · {header.width}x{header.height}"


def clip_windows(header: ClipHeader, concept: ConceptConfig, rule: VideoRule | None, rule_error: str = "") -> str:
    """What the clip gives under the concept's video settings for the model type: its windows and their frames, the
    short-clip rule applied, or why it is skipped (an image model type: the scan's words)."""
    from onetrainer.data.video import plan_clip

    if rule_error:
        return f"windows unknown: {rule_error}"
    if rule is None:
        return f"{CLIPS_NEED_VIDEO}; skipped"
    plan = plan_clip(header, concept, rule)
    settings = concept.video
    resampled = f"{plan.length} frames at {settings.target_fps:g} fps; " if settings.target_fps > 0 else ""
    wanted = rule.wanted(concept)
    if not plan.bucket:
        return f"{resampled}shorter than {wanted} frames per clip: skipped"
    text = f"{resampled}{_count(plan.windows, 'window')} of {_count(plan.bucket, 'frame')}"
    if not plan.short.startswith("padded"):  # a padded clip gives its one window from its first frame
        text += f", {CLIP_MODE_WORDS.get(settings.clip_mode, settings.clip_mode)}"
    return text + (f" (shorter than {wanted} frames per clip: {plan.short})" if plan.short else "")


def _count(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


class ClipFrames:
    """A training clip shown a frame at a time (the clip widget's source for a concept's clips, and the dataset tool's
    canvas): its header, the frame shown and steps that wrap round its ends. Frames are
    decoded in runs of `CHUNK` (the run holding the frame asked for, made at most `limit` pixels on the longer side),
    so stepping through a clip decodes it once per run rather than from its start at every step. UnreadableClip from
    the constructor when its header cannot be read."""

    CHUNK = 8

    def __init__(self, path: Path, limit: int = 1024) -> None:
        self.path = path
        self.header = clip_header(path)
        self.limit = limit
        self.position = 0
        self._run: dict[int, Image.Image] = {}

    def frame(self) -> Image.Image:
        """The frame shown (UnreadableClip when it cannot be decoded: the clip ends before its header said)."""
        if self.position not in self._run:
            start = self.position // self.CHUNK * self.CHUNK
            numbers = list(range(start, min(start + self.CHUNK, self.header.frames)))
            try:
                decoded = clip_frame_run(self.path, numbers)
            except UnreadableClip:  # the run passes the clip's real end (a header's estimate): this frame alone
                numbers, decoded = [self.position], [clip_frame(self.path, self.position)]
            self._run = {number: _at_most(image, self.limit) for number, image in zip(numbers, decoded, strict=True)}
        return self._run[self.position]

    def step(self, delta: int) -> None:
        self.position = (self.position + delta) % self.header.frames

    def label(self) -> str:
        return f"frame {self.position + 1} / {self.header.frames}"

    # as the clip widget's frame source (`gui.widgets.clip_player.FrameSource`)
    @property
    def count(self) -> int:
        return self.header.frames

    @property
    def fps(self) -> float:
        return self.header.fps

    def frame_at(self, index: int) -> Image.Image:
        """Frame `index` (it becomes the frame shown)."""
        self.position = index
        return self.frame()


def clip_frame_run(path: Path, numbers: list[int]) -> list[Image.Image]:
    """The frames `numbers` of a clip, decoded in one pass (UnreadableClip as `clip_frame`)."""
    from onetrainer.data.video import decode_frames

    try:
        return decode_frames(path, numbers)
    except (ValueError, OSError, IndexError) as e:  # PyAV's errors are OSErrors or come as ValueError
        raise UnreadableClip(str(e) or type(e).__name__) from e


def _at_most(image: Image.Image, limit: int) -> Image.Image:
    if max(image.size) > limit:
        image.thumbnail((limit, limit))
    return image


def clip_census(concept: ConceptConfig, rule: VideoRule | None = None) -> ClipCensus:
    """The census of the concept's clips (its folder's, as the scan lists them) under the model type's `rule`
    (`clip_rule`; None: an image model type); reads headers only. The core is `data.video.clip_census`, which the
    CLI's preflight report counts with too."""
    from onetrainer.data.video import clip_census as census_of

    if not concept.path.strip():
        return ClipCensus()
    return census_of(concept_folder(concept.path), concept, rule)
