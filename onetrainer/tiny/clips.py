"""Synthetic training clips for the video try-it and the tests: coloured shapes moving over coloured backgrounds, with
captions, a mask clip and a still, built offline with PyAV (FFmpeg's libraries in its wheel; no system ffmpeg).

`write_demo_clips(folder)` writes, by default:
- `count` clips `NN-<colour>-<shape>.mp4` (H.264, `frames` frames at `fps`, `size`×`size`; the shape moves left to
  right, and a square bounces down and up) with `NN-<colour>-<shape>.txt` captions ("a red circle moving right on a
  blue background");
- for the first clip, its mask clip `…-masklabel.mkv` (lossless FFV1: white where the shape is, frame by frame), for
  masked training on per-frame masks;
- one still `still-<colour>-<shape>.png` with its caption, which a video model trains as a one-frame clip.

`tiny:clips` (`tiny/source.py`) names this folder, built once into the user's cache (`demo_clips_dir`).
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from onetrainer.tiny.images import COLOURS, SHAPES
from onetrainer.util.fs import atomic_directory

CLIPS_VERSION = 1
MOVES = ("moving right", "moving right", "bouncing")  # what each shape does, by its index modulo 3


def _draw(canvas: ImageDraw.ImageDraw, shape: str, box: tuple[int, int, int, int], fill) -> None:
    left, top, right, bottom = box
    if shape == "circle":
        canvas.ellipse(box, fill=fill)
    elif shape == "square":
        canvas.rectangle(box, fill=fill)
    else:
        canvas.polygon([((left + right) // 2, top), (right, bottom), (left, bottom)], fill=fill)


def _box(number: int, frames: int, size: int, move: str) -> tuple[int, int, int, int]:
    """Where the shape is in frame `number`: a third of the frame wide, moving across (or bouncing up and down)."""
    side = size // 3
    travel = size - side - 2
    share = number / max(1, frames - 1)
    if move == "bouncing":
        top = round(travel * (1 - abs(2 * share - 1)))
        left = (size - side) // 2
    else:
        left = round(travel * share)
        top = (size - side) // 2
    return left + 1, top + 1, left + side, top + side


def _write(path: Path, pictures: list[Image.Image], fps: int, codec: str, pixel_format: str) -> None:
    import av

    width, height = pictures[0].size
    with av.open(str(path), "w") as container:
        stream = container.add_stream(codec, rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, pixel_format
        for picture in pictures:
            frame = av.VideoFrame.from_ndarray(np.asarray(picture.convert("RGB")), format="rgb24")
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def write_demo_clips(
    folder: Path, count: int = 3, frames: int = 17, size: int = 64, fps: int = 8, seed: int = 0
) -> Path:
    """`count` clips of moving shapes with captions, the first with a mask clip, and a still (see the module)."""
    if count < 1 or frames < 1 or size < 16 or fps < 1:
        raise ValueError(f"demo clips: count {count}, frames {frames}, size {size}, fps {fps} (at least 1, 1, 16, 1)")
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    names = list(COLOURS)
    for i in range(count):
        shape, move = SHAPES[i % len(SHAPES)], MOVES[i % len(MOVES)]
        fg, bg = rng.sample(names, 2)
        pictures, masks = [], []
        for number in range(frames):
            box = _box(number, frames, size, move)
            picture = Image.new("RGB", (size, size), COLOURS[bg])
            mask = Image.new("L", (size, size), 0)
            _draw(ImageDraw.Draw(picture), shape, box, COLOURS[fg])
            _draw(ImageDraw.Draw(mask), shape, box, 255)
            pictures.append(picture)
            masks.append(mask)
        stem = f"{i:02d}-{fg}-{shape}"
        _write(folder / f"{stem}.mp4", pictures, fps, "libx264", "yuv420p")
        (folder / f"{stem}.txt").write_text(f"a {fg} {shape} {move} on a {bg} background\n", encoding="utf-8")
        if i == 0:
            _write(folder / f"{stem}-masklabel.mkv", masks, fps, "ffv1", "gray")
    fg, bg = rng.sample(names, 2)
    still = Image.new("RGB", (size, size), COLOURS[bg])
    _draw(ImageDraw.Draw(still), "circle", (size // 3, size // 3, 2 * size // 3, 2 * size // 3), COLOURS[fg])
    still.save(folder / f"still-{fg}-circle.png")
    (folder / f"still-{fg}-circle.txt").write_text(f"a {fg} circle on a {bg} background\n", encoding="utf-8")
    return folder


def demo_clips_dir(cache_root: Path) -> Path:
    """The demo clips, generated once into the cache and reused."""
    target = cache_root / f"demo-clips-v{CLIPS_VERSION}"
    if not target.is_dir():
        with atomic_directory(target) as tmp:
            write_demo_clips(tmp)
    return target
