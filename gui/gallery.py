"""The latest sample images: the newest image of each sample, from the trainer's events or the workspace folder.
A video model's samples are clips (a video file, or an image sequence folder: `onetrainer/sampling/clip_files.py`),
listed as images are.

The trainer writes each sample's images into `workspace_dir/samples/<index> - <prompt>[ - no-ema]/`; that folder name
identifies a sample here, for images heard of through `SampleReady` events and found on disk alike. No Tk.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from onetrainer.data.images import IMAGE_EXTENSIONS
from onetrainer.sampling.clip_files import CLIP_SUFFIXES, is_clip
from onetrainer.training.events import SampleReady

SAMPLES_FOLDER = "samples"
_FOLDER_NAME = re.compile(r"^(\d+) - (.*)$")
_FILE_STEP = re.compile(r"-sample-(\d+)-\d+-\d+$")  # the trainer's `<run>-training-sample-<step>-<epoch>-<epoch step>`


@dataclass(frozen=True)
class SampleImage:
    key: str  # the sample's folder name, e.g. "0 - a red circle"
    index: int
    prompt: str
    path: Path
    step: int | None = None  # known when heard of through an event

    @property
    def clip(self) -> bool:
        """Whether the sample is a clip (a video model's), shown as its first frame with a play control."""
        return is_clip(self.path)


def sample_history(folder: Path) -> list[Path]:
    """The images (and clips) of one sample's folder, oldest first."""
    if not folder.is_dir():
        return []
    images = [p for p in folder.iterdir() if _is_sample(p)]
    return sorted(images, key=lambda p: (p.stat().st_mtime_ns, p.name))


def _is_sample(path: Path) -> bool:
    if path.name.startswith("."):  # a write in progress (`util/fs.py`'s temporary siblings)
        return False
    if path.is_file():
        return path.suffix.lower() in (*IMAGE_EXTENSIONS, *CLIP_SUFFIXES)
    return is_clip(path)  # an image sequence folder


def scan_samples(workspace_dir: str | Path) -> dict[str, SampleImage]:
    """The newest image of every sample folder under the workspace's samples folder."""
    root = Path(workspace_dir).absolute() / SAMPLES_FOLDER
    found: dict[str, SampleImage] = {}
    if not root.is_dir():
        return found
    for folder in sorted(root.iterdir()):
        match = _FOLDER_NAME.match(folder.name)
        history = sample_history(folder) if match else []
        if match and history:
            newest = history[-1]
            step = _FILE_STEP.search(newest.stem)
            found[folder.name] = SampleImage(
                folder.name, int(match.group(1)), match.group(2), newest, int(step.group(1)) if step else None
            )
    return found


class SampleGallery:
    """The newest image per sample; listeners hear of each change."""

    def __init__(self) -> None:
        self.latest: dict[str, SampleImage] = {}
        self._listeners: list[Callable[[], None]] = []

    def add(self, event: SampleReady) -> SampleImage:
        path = Path(event.path).absolute()  # the trainer names it relative to the working directory it ran in
        image = SampleImage(path.parent.name, event.index, event.prompt, path, event.global_step)
        self.latest[image.key] = image
        self._notify()
        return image

    def scan(self, workspace_dir: str | Path) -> None:
        """Read the workspace's samples folder (images of earlier runs, or of a run started elsewhere)."""
        self.latest = scan_samples(workspace_dir)
        self._notify()

    def clear(self) -> None:
        self.latest = {}
        self._notify()

    def keep_workspace(self, workspace_dir: str | Path) -> None:
        """Forget the images that are not in this workspace's samples folder: after a preset or config with another
        workspace is loaded, the last run's samples (the demo's noise) are not this config's."""
        root = Path(workspace_dir).absolute() / SAMPLES_FOLDER
        kept = {key: image for key, image in self.latest.items() if image.path.is_relative_to(root)}
        if len(kept) != len(self.latest):
            self.latest = kept
            self._notify()

    def images(self) -> list[SampleImage]:
        """The newest image of each sample, by sample index."""
        return sorted(self.latest.values(), key=lambda s: (s.index, s.key))

    def subscribe(self, listener: Callable[[], None]) -> Callable[[], None]:
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    def _notify(self) -> None:
        for listener in list(self._listeners):
            listener()
