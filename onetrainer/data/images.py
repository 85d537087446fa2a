"""Finding and reading training images, captions, masks and reference images.

A training image `<stem>.<ext>` may have reference images beside it, for the edit models that learn to change one
image into another: `<stem>-reference.<ext>` (one), or `<stem>-reference-1.<ext>`, `<stem>-reference-2.<ext>`, …
(several, in their numbers' order), each of its own size. Such a file is a reference only where its image is there:
otherwise it is a training image like any other."""

from __future__ import annotations

import glob
import logging
import re
from pathlib import Path

from PIL import Image, ImageOps

# re-exported for the data side and the GUI; it lives in util/ so that a family's samples open images the same way
from onetrainer.util.images import open_rgb as open_rgb

log = logging.getLogger(__name__)

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".tif", ".tiff", ".avif")
MASK_SUFFIX = "-masklabel"
REFERENCE_SUFFIX = "-reference"
# A training image's depth map (`<stem>-depth.png`: brighter = nearer), for a model type with a depth input.
DEPTH_SUFFIX = "-depth"
_REFERENCE = re.compile(rf"^(?P<stem>.+){REFERENCE_SUFFIX}(?:-(?P<number>\d+))?$")


def is_training_image(path: Path) -> bool:
    stem = path.stem
    return (
        path.suffix.lower() in IMAGE_EXTENSIONS
        and not stem.endswith(MASK_SUFFIX)
        and not stem.endswith("-condlabel")
        and not is_reference_image(path)
        and not is_depth_map(path)
    )


def is_depth_map(path: Path) -> bool:
    """Whether `path` is the depth map of a training image beside it (`<stem>-depth.png`): never trained itself."""
    if path.suffix.lower() != ".png" or not path.stem.endswith(DEPTH_SUFFIX):
        return False
    stem = path.stem[: -len(DEPTH_SUFFIX)]
    return any(path.with_name(stem + ext).is_file() for ext in _with_upper(IMAGE_EXTENSIONS))


def depth_path_of(image: Path) -> Path:
    return image.with_name(f"{image.stem}{DEPTH_SUFFIX}.png")


def is_reference_image(path: Path) -> bool:
    """Whether `path` is a reference image of a training image beside it (`<stem>-reference[-N].<ext>`)."""
    match = _REFERENCE.match(path.stem)
    if match is None or path.suffix.lower() not in IMAGE_EXTENSIONS:
        return False
    return any(path.with_name(match["stem"] + ext).is_file() for ext in _with_upper(IMAGE_EXTENSIONS))


def reference_paths_of(image: Path) -> tuple[Path, ...]:
    """The reference images of a training image, in order: its one `-reference` file, else its numbered ones."""
    found: list[tuple[int, Path]] = []
    for candidate in image.parent.glob(f"{glob.escape(image.stem)}{REFERENCE_SUFFIX}*"):
        match = _REFERENCE.match(candidate.stem)
        if candidate.suffix.lower() not in IMAGE_EXTENSIONS or match is None or match["stem"] != image.stem:
            continue
        found.append((int(match["number"]) if match["number"] else 0, candidate))
    single = [path for number, path in found if number == 0]
    return tuple(single[:1]) if single else tuple(path for _, path in sorted(found))


def _with_upper(extensions: tuple[str, ...]) -> tuple[str, ...]:
    return extensions + tuple(ext.upper() for ext in extensions)


def list_images(folder: Path, include_subdirectories: bool = False) -> list[Path]:
    pattern = folder.rglob("*") if include_subdirectories else folder.glob("*")
    return sorted(p for p in pattern if p.is_file() and is_training_image(p))


def mask_path_of(image: Path) -> Path:
    return image.with_name(f"{image.stem}{MASK_SUFFIX}.png")


def open_mask(path: Path) -> Image.Image:
    with Image.open(path) as opened:
        return ImageOps.exif_transpose(opened).convert("L")


def read_text(path: Path) -> str:
    """A caption file as text; not UTF-8 falls back to Latin-1 with a warning naming the file."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        log.warning("%s is not UTF-8; read as Latin-1", path)
        return data.decode("latin-1")


def caption_lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]
