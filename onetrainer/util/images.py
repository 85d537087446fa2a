"""Opening an image file as the training data reads it: one way everywhere, for the training images, their
reference images and a sample's reference images alike."""

from __future__ import annotations

from pathlib import Path

from PIL import Image, ImageOps


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
