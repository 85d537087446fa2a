"""Synthetic training images for the demo: coloured shapes on coloured backgrounds, with captions, built offline."""

from __future__ import annotations

import random
from pathlib import Path

from PIL import Image, ImageDraw

from onetrainer.util.fs import atomic_directory

IMAGES_VERSION = 1
COLOURS = {
    "red": (220, 40, 40),
    "green": (40, 180, 70),
    "blue": (40, 80, 220),
    "yellow": (240, 210, 40),
    "purple": (140, 60, 180),
    "white": (245, 245, 245),
    "black": (20, 20, 20),
}
SHAPES = ("circle", "square", "triangle")


def write_demo_images(folder: Path, count: int = 12, size: int = 96, seed: int = 0) -> Path:
    """`count` images with `<name>.txt` captions, a few with `-masklabel.png` masks around the shape."""
    rng = random.Random(seed)
    names = list(COLOURS)
    for i in range(count):
        shape = SHAPES[i % len(SHAPES)]
        fg, bg = rng.sample(names, 2)
        image = Image.new("RGB", (size, size), COLOURS[bg])
        mask = Image.new("L", (size, size), 0)
        margin = rng.randint(size // 8, size // 4)
        box = (margin, margin, size - margin, size - margin)
        for canvas, fill in ((ImageDraw.Draw(image), COLOURS[fg]), (ImageDraw.Draw(mask), 255)):
            if shape == "circle":
                canvas.ellipse(box, fill=fill)
            elif shape == "square":
                canvas.rectangle(box, fill=fill)
            else:
                canvas.polygon(
                    [(size // 2, margin), (size - margin, size - margin), (margin, size - margin)], fill=fill
                )
        stem = f"{i:02d}-{fg}-{shape}"
        image.save(folder / f"{stem}.png")
        (folder / f"{stem}.txt").write_text(f"a {fg} {shape} on a {bg} background\n", encoding="utf-8")
        if i % 3 == 0:
            mask.save(folder / f"{stem}-masklabel.png")
    return folder


def demo_images_dir(cache_root: Path) -> Path:
    """The demo images, generated once into the cache and reused."""
    target = cache_root / f"demo-images-v{IMAGES_VERSION}"
    if not target.is_dir():
        with atomic_directory(target) as tmp:
            write_demo_images(tmp)
    return target
