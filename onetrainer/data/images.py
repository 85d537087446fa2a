"""Finding and reading training images, captions and masks."""

from __future__ import annotations

import logging
from pathlib import Path

from PIL import Image, ImageOps

log = logging.getLogger(__name__)

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".tif", ".tiff", ".avif")
MASK_SUFFIX = "-masklabel"


def is_training_image(path: Path) -> bool:
    stem = path.stem
    return (
        path.suffix.lower() in IMAGE_EXTENSIONS and not stem.endswith(MASK_SUFFIX) and not stem.endswith("-condlabel")
    )


def list_images(folder: Path, include_subdirectories: bool = False) -> list[Path]:
    pattern = folder.rglob("*") if include_subdirectories else folder.glob("*")
    return sorted(p for p in pattern if p.is_file() and is_training_image(p))


def mask_path_of(image: Path) -> Path:
    return image.with_name(f"{image.stem}{MASK_SUFFIX}.png")


def open_rgb(path: Path) -> Image.Image:
    """An image as RGB, turned the way its EXIF orientation says; transparency is composited onto white."""
    with Image.open(path) as opened:
        image = ImageOps.exif_transpose(opened)
        if image.mode in ("RGBA", "LA") or (image.mode == "P" and "transparency" in image.info):
            rgba = image.convert("RGBA")
            background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
            return Image.alpha_composite(background, rgba).convert("RGB")
        if image.mode == "I;16" or image.mode == "I":
            # 16-bit greyscale: scale to 8 bits instead of clipping.
            return image.point(lambda v: v / 256).convert("L").convert("RGB")
        return image.convert("RGB")


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
