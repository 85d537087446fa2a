"""Scanning the concepts: every image with its caption lines and mask, and every file that cannot be used, named.

Nothing is dropped silently: unreadable images, missing captions, missing or mis-sized masks, empty or missing folders
all end up in the scan's lists, which the preflight report shows and the trainer logs.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from PIL import Image, UnidentifiedImageError

from onetrainer.config.enums import ConceptType
from onetrainer.data.images import (
    IMAGE_EXTENSIONS,
    REFERENCE_SUFFIX,
    caption_lines,
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
    index: int, concept, folder: Path, masked: bool, references: ReferenceRule | bool | None = None
) -> ConceptScan:
    """The concept's images; `references`: how the model type trains on reference images (`reference_rule`): an image
    without one where they are required (`missing_references`) or with more than it takes (`too_many_references`) is
    skipped and named."""
    rule = _rule(references)
    label = concept.name or concept.path
    scan = ConceptScan(index, label, folder, concept.type)
    if not folder.is_dir():
        scan.problems.append(f"folder not found: {folder}")
        return scan
    images = list_images(folder, concept.include_subdirectories)
    if not images:
        scan.problems.append(f"no images in {folder}")
        return scan
    shared_lines: tuple[str, ...] = ()
    if concept.text.prompt_source == "concept":
        prompt_file = Path(concept.text.prompt_path).expanduser()
        if prompt_file.is_file():
            shared_lines = tuple(_read_caption(prompt_file, scan))
        else:
            scan.problems.append(f"caption file not found: {concept.text.prompt_path or '(empty)'}")
    for path in images:
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
        entry = ImageEntry(path, index, size[0], size[1], captions, mask, fingerprint(path), found)
        scan.images.append(entry)
    return scan


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

    def reason(self) -> str:
        """Why no image of the folder trains ("" when one does), naming the files passed over."""
        if self.image is not None:
            return ""
        if not self.listed:
            if self.in_subfolders:
                return f"no images in {self.folder}, only in its subfolders: turn on 'Include subdirectories'"
            return f"no images in {self.folder} ({', '.join(IMAGE_EXTENSIONS)})"
        count = f"{self.listed} image{'s' if self.listed > 1 else ''}"
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


_NAMED = 3  # files a reason names before "and N more"


def first_usable_image(
    folder: Path, include_subdirectories: bool = False, references: ReferenceRule | bool | None = None
) -> FirstUsable:
    """The first image of `folder` the scan would train on, reading headers in the scan's order until one is usable:
    one header for a folder that is fine, so the run checks and the concept card can afford it where a full scan
    (every header) is for the statistics and the run. `references`: how the model type trains on reference images
    (`reference_rule`)."""
    rule = _rule(references)
    images = list_images(folder, include_subdirectories) if folder.is_dir() else []
    unreadable: list[tuple[Path, str]] = []
    without: list[Path] = []
    too_many: list[tuple[Path, int]] = []
    for path in images:
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
        return FirstUsable(folder, path, len(images), tuple(unreadable), tuple(without), tuple(too_many))
    nested = not images and not include_subdirectories and folder.is_dir() and _images_below(folder)
    return FirstUsable(folder, None, len(images), tuple(unreadable), tuple(without), tuple(too_many), nested)


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


def scan_concepts(config: TrainConfig, resolve=lambda p: Path(p)) -> list[ConceptScan]:
    """Scan every enabled concept (training, validation and prior-prediction ones)."""
    out = []
    references = reference_rule(config)
    for index, concept in enumerate(config.concepts or []):
        if not concept.enabled:
            continue
        out.append(scan_concept(index, concept, Path(resolve(concept.path)), config.masked_training, references))
    return out


def trains_on_references(config: TrainConfig) -> bool:
    """Whether the config's model type learns from reference images (its family declares `reference_images`)."""
    from onetrainer.config.model_types import MODEL_TYPES

    info = MODEL_TYPES.get(config.model_type)
    return bool(info is not None and info.family.reference_images)


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
