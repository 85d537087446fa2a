"""Model downloads of a tool pass, shown and cancellable like the pass itself.

A first use downloads the model (hundreds of MB to a few GB). The pass sets, for its worker thread, where progress
goes and what cancels (`reported`); the downloaders (huggingface_hub's `snapshot_download` / `hf_hub_download`, and
our own u2net download) take `progress_bar()`, a tqdm class that still draws in the terminal and also emits
`DownloadProgress` events, and that raises `DownloadCancelled` on its next update once the pass is cancelled.
huggingface_hub downloads files on several threads, so the class carries its sink and control with it rather than
looking them up per thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Weights in other frameworks' formats, never read here.
_FOREIGN_WEIGHTS = ["*.h5", "*.msgpack", "*.ot", "tf_model*", "flax_model*", "rust_model*", "*.mlmodel*", "coreml/*"]
# Pickled weights, not needed when the repo has safetensors.
_PICKLED_WEIGHTS = ["*.bin", "*.pt", "*.pth", "*.ckpt"]
_EMIT_EVERY_S = 0.2


@dataclass(frozen=True)
class DownloadProgress:
    """`done` of `total` units (bytes for a file, files for a repo) of the download named `what`."""

    what: str
    done: int
    total: int | None
    unit: str
    eta_seconds: float | None


class DownloadCancelled(Exception):
    """The pass was cancelled during a download (the partial file stays in the cache and resumes next time)."""


_current = threading.local()


@contextmanager
def reported(emit: Callable[[Any], None], cancelled: Callable[[], bool]) -> Iterator[None]:
    """Downloads started on this thread during the block report to `emit` and stop when `cancelled()`."""
    previous = getattr(_current, "value", None)
    _current.value = (emit, cancelled)
    try:
        yield
    finally:
        _current.value = previous


def progress_bar() -> type:
    """A tqdm class for a downloader: the terminal bar, plus events and cancelling inside `reported`."""
    from huggingface_hub.utils import tqdm as hub_tqdm

    context = getattr(_current, "value", None)
    if context is None:
        return hub_tqdm
    emit, cancelled = context

    class ReportedBar(hub_tqdm):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            # Read from the arguments: a disabled tqdm (no terminal, or progress bars turned off) sets no attributes.
            self._what = str(kwargs.get("desc") or (args[1] if len(args) > 1 else "") or "model")
            self._total = kwargs.get("total") or (args[2] if len(args) > 2 else None)
            self._unit = str(kwargs.get("unit", "it"))
            self._last_emit = 0.0
            self._last_percent = -1
            self._started = time.monotonic()
            self._count = 0  # our own count: a disabled tqdm (no terminal) does not keep `n`

        def update(self, n: float | None = 1) -> bool | None:
            if cancelled():
                raise DownloadCancelled("cancelled during the download")
            shown = super().update(n)
            self._count += n or 0
            now = time.monotonic()
            # Each whole percent (a stalled download still shows where it is), or now and then without a total.
            percent = int(100 * self._count / self._total) if self._total else None
            due = percent != self._last_percent if percent is not None else now - self._last_emit >= _EMIT_EVERY_S
            if due:
                self._last_emit, self._last_percent = now, percent
                emit(self._progress(now))
            return shown

        def _progress(self, now: float) -> DownloadProgress:
            total = int(self._total) if self._total else None
            elapsed = now - self._started
            eta = None
            if total and self._count and elapsed > 0:
                eta = elapsed / self._count * max(total - self._count, 0)
            return DownloadProgress(self._what, int(self._count), total, self._unit, eta)

    return ReportedBar


def is_hub_id(name: str) -> bool:
    """A Hugging Face repo id rather than a local path."""
    from onetrainer.families.sources import _HUB_ID

    return not Path(name).expanduser().exists() and bool(_HUB_ID.match(name.strip()))


def hub_snapshot(repo_id: str, local_files_only: bool = False) -> str:
    """The repo's files in the local cache (downloaded now where missing, with progress): a folder path. Weights in
    formats we never read are left out (pickled ones too when the repo has safetensors). `local_files_only` (the hub
    is off or unreachable, and the repo is cached) reads the cache without asking the hub. When the hub cannot be
    asked the id is returned as it is, for `from_pretrained` to load from the cache or say what is missing."""
    from huggingface_hub import HfApi, snapshot_download

    if local_files_only:
        return snapshot_download(repo_id, local_files_only=True)
    try:
        files = HfApi().list_repo_files(repo_id)
    except Exception:
        return repo_id
    ignore = list(_FOREIGN_WEIGHTS)
    if any(name.endswith(".safetensors") for name in files):
        ignore += _PICKLED_WEIGHTS
    return snapshot_download(repo_id, ignore_patterns=ignore, tqdm_class=progress_bar())
