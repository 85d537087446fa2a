"""A video model type for the tests of video samples, registered at test time (the family contract allows it, as
`tests/families/tiny_dit_family.py` shows): the tiny DiT family declared as a video family (`FamilyInfo.video`), whose
`sample` returns a `SampleClip` of the sample's `frames` frames (the rendered image, shifted a few pixels per frame,
so that no two frames are alike) at `FPS`. Its stills train as one-frame clips: `encode_images` takes their
[B, 3, 1, H, W] pixels as the image family takes [B, 3, H, W]."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
from PIL import Image

from onetrainer.config.enums import ModelType, NoiseScheduler
from onetrainer.config.family_info import FrameCounts
from onetrainer.config.model_types import ModelTypeInfo, SampleDefaults, register_model_type
from onetrainer.families import register_family
from onetrainer.sampling.clip import SampleClip
from tests.families import tiny_dit_family, tiny_dit_tiny
from tests.families.tiny_dit_family import TinyDiTFamily

# A name of OneTrainer's list for the test family to take while registered (it replaces the built-in HunyuanVideo's
# declaration, which the undo puts back).
MODEL_TYPE = ModelType.HUNYUAN_VIDEO
BASE_MODEL = tiny_dit_family.BASE_MODEL
FPS = 8.0
INFO = dataclasses.replace(
    tiny_dit_family.INFO, key="tiny_video_dit", label="Tiny video DiT (test family)", video=FrameCounts()
)
MODEL_TYPE_INFO = ModelTypeInfo(
    MODEL_TYPE, "Tiny video DiT", INFO, 64, False, False, SampleDefaults(64, 64, 2, 3.0, NoiseScheduler.DDIM)
)


class TinyVideoFamily(TinyDiTFamily):
    info = INFO

    def encode_images(self, model, pixels):
        if pixels.dim() == 5:  # [B, 3, F, H, W]: a still is a one-frame clip
            pixels = pixels[:, :, 0]
        return super().encode_images(model, pixels)

    def sample(self, model, sample, apply_embeddings, zero_terminal_snr) -> SampleClip:
        image = np.asarray(super().sample(model, sample, apply_embeddings, zero_terminal_snr))
        frames = [Image.fromarray(np.roll(image, 4 * i, axis=1)) for i in range(sample.frames)]
        return SampleClip(frames, FPS)


def register() -> Callable[[], None]:
    """Make the video model type, its family and the tiny DiT's tiny model known. Returns the undo."""
    undos = [
        register_model_type(MODEL_TYPE_INFO),
        register_family(INFO.key, f"{__name__}:TinyVideoFamily"),
        tiny_dit_tiny.register(),
    ]

    def undo() -> None:
        for step in reversed(undos):
            step()

    return undo
