"""Images in widgets: scaled to fit a box, as customtkinter images (which follow the window's scaling)."""

from __future__ import annotations

from pathlib import Path

import customtkinter as ctk
from PIL import Image, UnidentifiedImageError

from onetrainer.data.images import open_rgb


def fit_size(size: tuple[int, int], box: tuple[int, int], upscale: bool = True) -> tuple[int, int]:
    """The largest size with `size`'s aspect ratio that fits in `box` (never 0; no upscaling unless asked)."""
    width, height = size
    scale = min(box[0] / max(1, width), box[1] / max(1, height))
    if not upscale:
        scale = min(scale, 1.0)
    return max(1, round(width * scale)), max(1, round(height * scale))


def fitted(image: Image.Image, box: tuple[int, int], upscale: bool = True) -> ctk.CTkImage:
    """A CTkImage showing `image` at the largest size that fits in `box`."""
    return ctk.CTkImage(light_image=image, dark_image=image, size=fit_size(image.size, box, upscale))


def thumbnail_image(path: Path, box: tuple[int, int]) -> Image.Image | None:
    """The image file at `path` decoded and made small (no Tk: a worker thread may call it); a sample clip's first
    frame; None when unreadable."""
    from onetrainer.sampling.clip_files import is_clip, read_clip

    try:
        image = read_clip(path, max_frames=1).first if is_clip(path) else open_rgb(path)
    except (OSError, UnidentifiedImageError, ValueError):
        return None
    image.thumbnail((box[0] * 2, box[1] * 2))  # keep some pixels for HiDPI scaling
    return image


def blank() -> ctk.CTkImage:
    """A transparent pixel: CTkLabel keeps showing its old picture when given image=None, so it gets this instead."""
    pixel = Image.new("RGBA", (1, 1), (0, 0, 0, 0))
    return ctk.CTkImage(light_image=pixel, dark_image=pixel, size=(1, 1))


def set_picture(label: ctk.CTkLabel, picture: ctk.CTkImage | None, text: str = "") -> None:
    """Show `picture` in `label`, or only `text` when there is none."""
    label.configure(image=picture if picture is not None else blank(), text=text)
