"""How fast the cache fills, and how quickly a second run over a fully cached dataset starts training.

Both go through `run_training` on the tiny SD 1.5 model with the demo preset's settings (latent caching on, frozen
text encoder, so captions are cached too) over `count` synthetic images of mixed sizes. The first run starts on an
empty cache directory: its `CacheFilled` events give the encoding throughput. The second run uses the same cache
directory: nothing is encoded, and the time from the call to its first finished step is the start a user waits for
when they train again on the same data.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch


@dataclass(frozen=True)
class StartRun:
    """One run stopped after its first step: how long it took to get there and what its caches did."""

    seconds_to_first_step: float
    latents_needed: int
    latents_encoded: int
    latent_seconds: float
    captions_encoded: int

    @property
    def images_per_second(self) -> float:
        return self.latents_encoded / self.latent_seconds if self.latent_seconds > 0 else 0.0


@dataclass(frozen=True)
class CachingResult:
    images: int
    resolution: str
    device: str
    cold: StartRun
    warm: StartRun

    def to_dict(self) -> dict:
        return {
            "images": self.images,
            "resolution": self.resolution,
            "device": self.device,
            "caching_images_per_second": self.cold.images_per_second,
            "cold_start_seconds": self.cold.seconds_to_first_step,
            "cached_start_seconds": self.warm.seconds_to_first_step,
            "cold": {**asdict(self.cold), "images_per_second": self.cold.images_per_second},
            "warm": {**asdict(self.warm), "images_per_second": self.warm.images_per_second},
        }


class _FirstStepClock:
    """Records the cache events and the time of the first finished step, then asks the trainer to stop."""

    def __init__(self, control) -> None:
        self.control = control
        self.first_step: float | None = None
        self.latents = None
        self.captions = None

    def emit(self, event) -> None:
        from onetrainer.training.events import CacheFilled, Metrics

        if isinstance(event, CacheFilled):
            if event.kind == "latents":
                self.latents = event
            else:
                self.captions = event
        elif isinstance(event, Metrics) and self.first_step is None:
            self.first_step = time.perf_counter()
            self.control.request_stop()

    def close(self) -> None:
        pass


def write_mixed_images(folder: Path, count: int, seed: int = 0) -> Path:
    """`count` captioned images of a few sizes and aspect ratios (so several buckets are encoded)."""
    import numpy as np
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    sizes = [(96, 96), (128, 96), (96, 128), (160, 112)]
    for i in range(count):
        width, height = sizes[i % len(sizes)]
        base = rng.integers(0, 256, size=(1, 1, 3))
        noise = rng.integers(-40, 40, size=(height, width, 3))
        pixels = np.clip(base + noise, 0, 255).astype(np.uint8)
        Image.fromarray(pixels).save(folder / f"image-{i:04d}.png")
        (folder / f"image-{i:04d}.txt").write_text(f"a picture number {i}", encoding="utf-8")
    return folder


def start_once(workdir: Path, images: Path, name: str, device: torch.device) -> StartRun:
    from onetrainer.benchmark.overhead import demo_config
    from onetrainer.training.control import TrainingControl
    from onetrainer.training.events import Failed
    from onetrainer.training.runner import run_training

    output = workdir / "out" / f"{name}.safetensors"
    config = demo_config(images, workdir / "workspace" / name, workdir / "cache", output, device, "epochs=1")
    control = TrainingControl()
    clock = _FirstStepClock(control)
    start = time.perf_counter()
    outcome = run_training(config, control, [clock], checked=False)
    if isinstance(outcome, Failed):
        raise RuntimeError(f"our trainer failed: {outcome.message}\n{outcome.traceback}")
    if clock.first_step is None or clock.latents is None:
        raise RuntimeError("the run ended before its first step or without filling its cache")
    return StartRun(
        seconds_to_first_step=clock.first_step - start,
        latents_needed=clock.latents.needed,
        latents_encoded=clock.latents.encoded,
        latent_seconds=clock.latents.seconds,
        captions_encoded=clock.captions.encoded if clock.captions else 0,
    )


def measure_caching(count: int = 64, workdir: Path | None = None, device: torch.device | None = None) -> CachingResult:
    """A cold start (empty cache) and then a fully cached start over the same `count` images."""
    device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
    with tempfile.TemporaryDirectory(prefix="onetrainer-benchmark-cache-") as tmp:
        root = Path(workdir) if workdir else Path(tmp)
        images = write_mixed_images(root / "images", count)
        cold = start_once(root, images, "cold", device)
        warm = start_once(root, images, "warm", device)
    from onetrainer.config import load_preset

    resolution = load_preset("demo")[0].resolution
    return CachingResult(count, resolution, str(device), cold, warm)
