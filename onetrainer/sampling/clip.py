"""A video sample: what a video family's `sample` returns where an image family returns one image.

The frames are in order, each an RGB image of the sample's size; `fps` is the rate they play at. Writing a clip (the
`sample_video_format`), showing it in TensorBoard and in the app read this type, so a family only renders it."""

from __future__ import annotations

from dataclasses import dataclass

from PIL import Image


@dataclass
class SampleClip:
    frames: list[Image.Image]
    fps: float

    def __post_init__(self) -> None:
        if not self.frames:
            raise ValueError("a sample clip needs at least one frame")
        if self.fps <= 0:
            raise ValueError(f"a sample clip's fps must be positive, not {self.fps}")

    @property
    def first(self) -> Image.Image:
        """The still that stands for the clip where one image is shown (a thumbnail, a broken-sample check)."""
        return self.frames[0]
