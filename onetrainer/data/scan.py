"""Scanning the concepts: every image (and, on a video model type, every clip's windows) with its caption lines and
mask, and every file that cannot be used, named.

Nothing is dropped silently: unreadable images, missing captions, missing or mis-sized masks, empty or missing folders
all end up in the scan's lists, which the preflight report shows and the trainer logs. So do clips on an image model
type (`clips_need_video`: skipped) and clips shorter than their frames per clip (`short_clips`: what was done).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from PIL import Image, UnidentifiedImageError

from onetrainer.config.enums import ConceptType
from onetrainer.data import video as clips
from onetrainer.data.images import (
    IMAGE_EXTENSIONS,
    REFERENCE_SUFFIX,
    caption_lines,
    depth_path_of,
    is_training_image,
    list_images,
    mask_path_of,
    read_text,
    reference_paths_of,
)

if TYPE_CHECKING:
    from onetrainer.config import TrainConfig

log = logging.getLogger(__name__)

_ROTATED_ORIENTATIONS = {5, 6, 7, 8}  # EXIF orientations that swap width and height
SMALL_IMAGE = 16  # pixels on the shorter side: scaled up to the bucket, such an image trains mostly blur
CLIPS_NEED_VIDEO = "clips need a video model type"  # what the scan, the run and --check say of clips on image models
LONG_CAPTION = 10_000  # characters; CLIP reads 77 tokens (a few hundred characters), so a longer file is a mistake


@dataclass(frozen=True)
class ImageEntry:
    path: Path
    concept: int  # index into config.concepts
    width: int  # as displayed (EXIF orientation applied)
    height: int
    captions: tuple[str, ...]  # candidate lines; one is drawn per epoch
    mask: Path | None
    fingerprint: str  # changes whenever the file changes (size and modification time)
    references: tuple[Path, ...] = ()  # its reference images, in order (`images.reference_paths_of`)
    # On a video model type: the frames each sample trains with (its temporal bucket; 1 for a still). 0: an image on
    # an image model type (its samples are [3, H, W], not [3, F, H, W]).
    frames: int = 0
    window: int = 0  # which window of its clip this entry trains (`video.window_indexes`)
    clip: clips.ClipHeader | None = None  # a clip's header (None: a still image)
    depth: Path | None = None  # its depth map beside it (`images.depth_path_of`), read by a model with a depth input


@dataclass
class ConceptScan:
    index: int
    name: str
    folder: Path
    kind: ConceptType
    images: list[ImageEntry] = field(default_factory=list)
    unreadable: list[tuple[Path, str]] = field(default_factory=list)
    missing_captions: list[Path] = field(default_factory=list)
    missing_masks: list[Path] = field(default_factory=list)
    # images without a reference image where the model type needs one: skipped, each named
    missing_references: list[Path] = field(default_factory=list)
    # images with more reference images than the model type takes (image, count): skipped, each named
    too_many_references: list[tuple[Path, int]] = field(default_factory=list)
    resized_masks: list[Path] = field(default_factory=list)
    # clips where the model type is not a video one: skipped, each named ("clips need a video model type")
    clips_need_video: list[Path] = field(default_factory=list)
    # clips shorter than their concept's frames per clip: (clip, its frames at the target rate, the frames per clip,
    # what was done: "trained at N frames", "padded with its last frame" or "skipped")
    short_clips: list[tuple[Path, int, int, str]] = field(default_factory=list)
    # mask clips whose frame count is not their clip's: (mask clip, its frames, the clip's frames); not used, the clip
    # takes its mask picture if it has one, else it trains whole
    mismatched_mask_clips: list[tuple[Path, int, int]] = field(default_factory=list)
    caption_warnings: list[str] = field(default_factory=list)
    image_warnings: list[str] = field(default_factory=list)  # used, but probably not what the user meant
    problems: list[str] = field(default_factory=list)  # the concept as a whole: folder missing, empty, …


def fingerprint(path: Path) -> str:
    stat = path.stat()
    return f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}"


@dataclass(frozen=True)
class ReferenceRule:
    """How a model type trains on reference images (its family's `reference_images`, `references_required` and
    `max_references`): which images the scan skips, each named."""

    required: bool = True  # an image without one is skipped (else it trains as plain text to image)
    most: int = 0  # an image with more is skipped (0: no limit)
    label: str = "this model type"

    def why_skipped(self, count: int) -> str:
        """Why an image with `count` references does not train ("" when it does)."""
        if count == 0 and self.required:
            return "no reference image"
        if self.most and count > self.most:
            return f"{count} reference images ({self.label} takes {_at_most(self.most)})"
        return ""


def _at_most(most: int) -> str:
    return "one" if most == 1 else f"at most {most}"


def _rule(references: ReferenceRule | bool | None) -> ReferenceRule | None:
    """`True`: references required, any number (an edit-only model's rule)."""
    if references is True:
        return ReferenceRule()
    return references or None


def scan_concept(
    index: int,
    concept,
    folder: Path,
    masked: bool,
    references: ReferenceRule | bool | None = None,
    video: clips.VideoRule | None = None,
) -> ConceptScan:
    """The concept's images; `references`: how the model type trains on reference images (`reference_rule`): an image
    without one where they are required (`missing_references`) or with more than it takes (`too_many_references`) is
    skipped and named. `video`: how the model type trains on clips (`video_rule`): each clip gives an entry per window
    and each still one of one frame; None (an image model type): the clips are named in `clips_need_video`."""
    rule = _rule(references)
    label = concept.name or concept.path
    scan = ConceptScan(index, label, folder, concept.type)
    if not folder.is_dir():
        scan.problems.append(f"folder not found: {folder}")
        return scan
    images = list_images(folder, concept.include_subdirectories)
    found_clips = clips.list_clips(folder, concept.include_subdirectories)
    if video is None:
        scan.clips_need_video = found_clips
        found_clips = []
    if not images and not found_clips:
        held = scan.clips_need_video
        need = f" (only {_count(len(held), 'clip')}: {CLIPS_NEED_VIDEO})" if held else ""
        scan.problems.append(f"no images in {folder}{need}")
        return scan
    shared_lines: tuple[str, ...] = ()
    if concept.text.prompt_source == "concept":
        prompt_file = Path(concept.text.prompt_path).expanduser()
        if prompt_file.is_file():
            shared_lines = tuple(_read_caption(prompt_file, scan))
        else:
            scan.problems.append(f"caption file not found: {concept.text.prompt_path or '(empty)'}")
    for path in sorted(images + found_clips):
        if video is not None and clips.is_clip(path):
            _scan_clip(path, index, concept, shared_lines, masked, video, scan)
            continue
        size = _image_size(path, scan)
        if size is None:
            continue
        if min(size) < SMALL_IMAGE:
            scan.image_warnings.append(f"{path} is only {size[0]}x{size[1]} pixels: scaled up, it trains mostly blur")
        captions = _captions_of(path, concept, shared_lines, scan)
        mask = mask_path_of(path)
        if mask.is_file():
            mask_size = _image_size(mask, None)
            if mask_size is not None and mask_size != size:
                scan.resized_masks.append(mask)
        else:
            mask = None
            if masked:
                scan.missing_masks.append(path)
        found = reference_paths_of(path)
        if rule is not None and rule.why_skipped(len(found)):
            if found:
                scan.too_many_references.append((path, len(found)))
            else:
                scan.missing_references.append(path)
            continue
        depth = depth_path_of(path)
        entry = ImageEntry(path, index, size[0], size[1], captions, mask, fingerprint(path), found)
        if depth.is_file():
            entry = replace(entry, depth=depth)
        if video is not None:  # a still trains as a one-frame clip
            entry = replace(entry, frames=1)
        scan.images.append(entry)
    return scan


def _scan_clip(path: Path, index: int, concept, shared: tuple[str, ...], masked: bool, video, scan: ConceptScan):
    """A clip's entries, one per window (its header read, no frame decoded), or the clip named where it gives none."""
    try:
        header = clips.clip_header(path)
    except clips.UnreadableClip as e:
        scan.unreadable.append((path, str(e)))
        return
    if min(header.width, header.height) < SMALL_IMAGE:
        scan.image_warnings.append(
            f"{path} is only {header.width}x{header.height} pixels: scaled up, it trains mostly blur"
        )
    plan = clips.plan_clip(header, concept, video)
    if plan.short:
        scan.short_clips.append((path, plan.length, video.wanted(concept), plan.short))
    if not plan.bucket:
        return
    captions = _captions_of(path, concept, shared, scan)
    mask = _clip_mask(path, header, scan)
    if mask is None and masked:
        scan.missing_masks.append(path)
    mark = fingerprint(path)
    for window in range(plan.windows):
        entry = ImageEntry(path, index, header.width, header.height, captions, mask, mark, (), plan.bucket, window)
        scan.images.append(replace(entry, clip=header))


def _clip_mask(path: Path, header: clips.ClipHeader, scan: ConceptScan) -> Path | None:
    """The clip's mask: its mask clip where its frame count is the clip's (else named in `mismatched_mask_clips`), else
    its mask picture, else None; one of another size is named in `resized_masks` (it is scaled to the clip's)."""
    mask_clip = clips.mask_clip_of(path)
    if mask_clip is not None:
        try:
            mask_header = clips.clip_header(mask_clip)
        except clips.UnreadableClip as e:  # the clip itself trains: a warning, not an unreadable training file
            scan.image_warnings.append(f"{mask_clip}: the mask clip cannot be read ({e}); not used")
        else:
            if mask_header.frames == header.frames:
                if (mask_header.width, mask_header.height) != (header.width, header.height):
                    scan.resized_masks.append(mask_clip)
                return mask_clip
            scan.mismatched_mask_clips.append((mask_clip, mask_header.frames, header.frames))
    mask = mask_path_of(path)
    if not mask.is_file():
        return None
    mask_size = _image_size(mask, None)
    if mask_size is not None and mask_size != (header.width, header.height):
        scan.resized_masks.append(mask)
    return mask


def _count(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


@dataclass(frozen=True)
class FirstUsable:
    """The first image of a folder that a run trains on, and what was passed over to find it."""

    folder: Path
    image: Path | None  # None: no image of the folder trains
    listed: int  # image files in the folder (by extension)
    unreadable: tuple[tuple[Path, str], ...] = ()  # passed over: cannot be read (file, reason)
    without_references: tuple[Path, ...] = ()  # passed over: no reference image, where the model needs one
    too_many_references: tuple[tuple[Path, int], ...] = ()  # passed over: more references than the model takes
    in_subfolders: bool = False  # none listed, but its subfolders hold images (include_subdirectories is off)
    clips_need_video: tuple[Path, ...] = ()  # clips passed over: the model type is not a video one

    def reason(self) -> str:
        """Why no image of the folder trains ("" when one does), naming the files passed over."""
        if self.image is not None:
            return ""
        if not self.listed:
            if self.clips_need_video:
                only = _count(len(self.clips_need_video), "clip")
                return f"no images in {self.folder}, only {only}: {self.clips_text()}"
            if self.in_subfolders:
                return f"no images in {self.folder}, only in its subfolders: turn on 'Include subdirectories'"
            return f"no images in {self.folder} ({', '.join(IMAGE_EXTENSIONS)})"
        count = _count(self.listed, "image" if self.image_files_only else "file")
        parts = []
        if self.unreadable:
            shown = ", ".join(f"{path.name} ({why})" for path, why in self.unreadable[:_NAMED])
            more = f" and {len(self.unreadable) - _NAMED} more" if len(self.unreadable) > _NAMED else ""
            parts.append(f"{len(self.unreadable)} cannot be read: {shown}{more}")
        if self.without_references:
            shown = ", ".join(path.name for path in self.without_references[:_NAMED])
            more = f" and {len(self.without_references) - _NAMED} more" if len(self.without_references) > _NAMED else ""
            count_without = len(self.without_references)
            have = "has no reference image beside it" if count_without == 1 else "have no reference image beside them"
            parts.append(
                f"{count_without} {have} (<name>{REFERENCE_SUFFIX}.png), which this model type trains on: {shown}{more}"
            )
        if self.too_many_references:
            many = self.too_many_references
            shown = ", ".join(f"{path.name} ({n})" for path, n in many[:_NAMED])
            more = f" and {len(many) - _NAMED} more" if len(many) > _NAMED else ""
            have = "has" if len(many) == 1 else "have"
            parts.append(f"{len(many)} {have} more reference images than this model type takes: {shown}{more}")
        return f"none of the {count} in {self.folder} can be trained: " + "; ".join(parts)

    @property
    def image_files_only(self) -> bool:
        return not any(clips.is_clip(path) for path, _ in self.unreadable)

    def clips_text(self) -> str:
        """The clips passed over as the model type is not a video one, named ("" when none)."""
        held = self.clips_need_video
        if not held:
            return ""
        shown = ", ".join(path.name for path in held[:_NAMED])
        more = f" and {len(held) - _NAMED} more" if len(held) > _NAMED else ""
        return f"{CLIPS_NEED_VIDEO}, skipped: {shown}{more}"


_NAMED = 3  # files a reason names before "and N more"


def first_usable_image(
    folder: Path,
    include_subdirectories: bool = False,
    references: ReferenceRule | bool | None = None,
    video: clips.VideoRule | None = None,
) -> FirstUsable:
    """The first image of `folder` the scan would train on, reading headers in the scan's order until one is usable:
    one header for a folder that is fine, so the run checks and the concept card can afford it where a full scan
    (every header) is for the statistics and the run. `references`: how the model type trains on reference images
    (`reference_rule`); `video`: how it trains on clips (`video_rule`; a clip whose header reads is usable), None: the
    folder's clips are listed in `clips_need_video`."""
    rule = _rule(references)
    images = list_images(folder, include_subdirectories) if folder.is_dir() else []
    found_clips = clips.list_clips(folder, include_subdirectories) if folder.is_dir() else []
    need_video = tuple(found_clips) if video is None else ()
    if video is not None:
        images = sorted(images + found_clips)
    unreadable: list[tuple[Path, str]] = []
    without: list[Path] = []
    too_many: list[tuple[Path, int]] = []
    for path in images:
        if video is not None and clips.is_clip(path):
            try:
                clips.clip_header(path)
            except clips.UnreadableClip as e:
                unreadable.append((path, str(e)))
                continue
            return FirstUsable(folder, path, len(images), tuple(unreadable), clips_need_video=need_video)
        try:
            image_size(path)
        except UnreadableImage as e:
            unreadable.append((path, str(e)))
            continue
        count = len(reference_paths_of(path)) if rule is not None else 0
        if rule is not None and rule.why_skipped(count):
            if count:
                too_many.append((path, count))
            else:
                without.append(path)
            continue
        return FirstUsable(
            folder, path, len(images), tuple(unreadable), tuple(without), tuple(too_many), clips_need_video=need_video
        )
    nested = not images and not include_subdirectories and folder.is_dir() and _images_below(folder)
    return FirstUsable(
        folder, None, len(images), tuple(unreadable), tuple(without), tuple(too_many), nested, need_video
    )


def _images_below(folder: Path) -> bool:
    """Whether a subfolder holds an image: one level down only, as a folder chosen by mistake may be a whole drive."""
    try:
        subfolders = [sub for sub in folder.iterdir() if sub.is_dir()]
        return any(p.is_file() and is_training_image(p) for sub in subfolders for p in sub.iterdir())
    except OSError:  # a subfolder that cannot be listed
        return False


class UnreadableImage(Exception):
    """A file the scan cannot use as an image; its text says why."""


def image_size(path: Path) -> tuple[int, int]:
    """The displayed size, from the header only (EXIF orientation applied); UnreadableImage for a file PIL cannot
    identify or verify."""
    try:
        if path.stat().st_size == 0:
            raise ValueError("the file is empty")
        with Image.open(path) as image:
            image.verify()  # must come right after opening; it catches truncated and damaged files cheaply
        with Image.open(path) as image:
            width, height = image.size
            orientation = image.getexif().get(0x0112, 1)
    except (OSError, ValueError, UnidentifiedImageError, SyntaxError, Image.DecompressionBombError) as e:
        raise UnreadableImage(_reason(e)) from e
    if orientation in _ROTATED_ORIENTATIONS:
        width, height = height, width
    return width, height


def _image_size(path: Path, scan: ConceptScan | None) -> tuple[int, int] | None:
    """`image_size`, or None with the file reported in the scan's `unreadable`."""
    try:
        return image_size(path)
    except UnreadableImage as e:
        if scan is not None:
            scan.unreadable.append((path, str(e)))
        return None


def _reason(error: Exception) -> str:
    if isinstance(error, UnidentifiedImageError):
        return "not an image PIL can read"
    if isinstance(error, Image.DecompressionBombError):
        limit = Image.MAX_IMAGE_PIXELS or 0
        return f"more than twice Pillow's limit of {limit:,} pixels, which guards against decompression bombs"
    return str(error) or type(error).__name__


def _captions_of(path: Path, concept, shared: tuple[str, ...], scan: ConceptScan) -> tuple[str, ...]:
    source = concept.text.prompt_source
    if source == "filename":
        return (path.stem.replace("_", " "),)
    if source == "concept":
        return shared or ("",)
    caption_file = path.with_suffix(".txt")
    if not caption_file.is_file():
        scan.missing_captions.append(path)
        return ("",)
    lines = _read_caption(caption_file, scan)
    return tuple(lines) or ("",)


def _read_caption(path: Path, scan: ConceptScan) -> list[str]:
    data = path.read_bytes()
    if len(data) > LONG_CAPTION:
        scan.caption_warnings.append(
            f"{path} is {len(data):,} bytes long: a caption is read up to 77 tokens (a few hundred characters); "
            "is it the right file?"
        )
    try:
        data.decode("utf-8-sig")
    except UnicodeDecodeError:
        scan.caption_warnings.append(f"{path} is not UTF-8; read as Latin-1")
    return caption_lines(read_text(path))


def scan_concepts(config: TrainConfig, resolve=lambda p: Path(p), video=...) -> list[ConceptScan]:
    """Scan every enabled concept (training, validation and prior-prediction ones); `video`: how clips train (by
    default the model type's `video_rule`)."""
    out = []
    references = reference_rule(config)
    if video is ...:
        video = video_rule(config)
    for index, concept in enumerate(config.concepts or []):
        if not concept.enabled:
            continue
        folder = Path(resolve(concept.path))
        out.append(scan_concept(index, concept, folder, config.masked_training, references, video))
    return out


def video_rule(config: TrainConfig) -> clips.VideoRule | None:
    """How the config's model type trains on clips (None: an image model type, whose concepts' clips are skipped)."""
    from onetrainer.config.model_types import MODEL_TYPES

    info = MODEL_TYPES.get(config.model_type)
    if info is None or info.family.video is None:
        return None
    return clips.VideoRule(info.family.video, run_frames(config), info.label)


def run_frames(config: TrainConfig) -> int:
    """The training's frames per clip (OneTrainer's `frames`, a text field): ValueError naming it when not a count."""
    text = str(config.frames).strip()
    try:
        frames = int(text)
    except ValueError:
        raise ValueError(f"frames: {text!r} is not a whole number of frames") from None
    if frames < 1:
        raise ValueError(f"frames: {frames} is not a positive number of frames")
    return frames


def trains_on_references(config: TrainConfig) -> bool:
    """Whether the config's model type learns from reference images (its family declares `reference_images`)."""
    from onetrainer.config.model_types import MODEL_TYPES

    info = MODEL_TYPES.get(config.model_type)
    return bool(info is not None and info.family.reference_images)


def text_reads_references(config: TrainConfig) -> bool:
    """Whether the config's model type encodes each caption with its image's references (`text_reads_references`)."""
    from onetrainer.config.model_types import MODEL_TYPES

    info = MODEL_TYPES.get(config.model_type)
    return bool(info is not None and info.family.reference_images and info.family.text_reads_references)


def reference_rule(config: TrainConfig) -> ReferenceRule | None:
    """How the config's model type trains on reference images (None: it ignores them)."""
    from onetrainer.config.model_types import MODEL_TYPES

    info = MODEL_TYPES.get(config.model_type)
    if info is None or not info.family.reference_images:
        return None
    family = info.family
    return ReferenceRule(family.references_required, family.max_references, info.label)


def is_trained(scan: ConceptScan) -> bool:
    return scan.kind is not ConceptType.VALIDATION
