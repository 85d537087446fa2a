"""Tiny clips for the GUI tests, written with PyAV: frame n has red = 20·n (so a decoded frame says which it is)
over a fixed green gradient, left to right."""

from __future__ import annotations

from pathlib import Path

import av
import numpy as np

CODECS = {".mp4": ("libx264", "yuv420p"), ".mkv": ("ffv1", "bgr0")}


def write_clip(path: Path, frames: int = 12, size: tuple[int, int] = (32, 32), fps: int = 12) -> Path:
    codec, pixel_format = CODECS[path.suffix]
    width, height = size
    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), "w") as container:
        stream = container.add_stream(codec, rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, pixel_format
        for number in range(frames):
            array = np.zeros((height, width, 3), np.uint8)
            array[..., 0] = number * 20
            array[..., 1] = np.linspace(0, 255, width, dtype=np.float32)[None, :].round().astype(np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(array, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def write_corrupt_clip(path: Path) -> Path:
    """An mp4 by its name and first bytes, nothing a decoder can read."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\x00\x00\x00\x18ftypmp42" + b"not a video" * 40)
    return path


def frame_number(image) -> int:
    """Which frame a decoded picture is (its red channel in the middle; lossy codecs are off by a little)."""
    red = image.convert("RGB").getpixel((image.width // 2, image.height // 2))[0]
    return round(red / 20)
