"""One pass of a tool (masking, captioning) over the images of a folder, shared by the scripts and the app.

The pass reports through events like training does (`training/events.py`): sinks receive small frozen dataclasses,
the console sink draws a tqdm bar, a `QueueSink` hands them to the window, which polls it from its Tk loop while
`PassThread` runs the pass on a worker thread. Cancelling sets a flag that is checked between images, and ends a
model load or download at once (`_load`).

A pass loads its model once, only when at least one image needs work, and releases it at the end (and the CUDA cache
with it), so a pass run from the app gives the VRAM back for training.
"""

from __future__ import annotations

import gc
import sys
import threading
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from onetrainer.data.images import list_images
from onetrainer.tools.downloads import DownloadCancelled, DownloadProgress, reported
from onetrainer.training.events import Broadcast, EventSink, QueueSink


@dataclass(frozen=True)
class PassStarted:
    """`total` images will be worked on; `kept` others already have their result and are left alone."""

    what: str
    total: int
    kept: int


@dataclass(frozen=True)
class PassStatus:
    text: str  # "loading CIDAS/clipseg-rd64-refined", ...


@dataclass(frozen=True)
class ImageDone:
    done: int
    total: int
    path: str
    written: str  # the file written
    eta_seconds: float | None


@dataclass(frozen=True)
class ImageSkipped:
    """An image that could not be read or whose result could not be written; the pass goes on."""

    done: int
    total: int
    path: str
    reason: str


@dataclass(frozen=True)
class PassFinished:
    written: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)  # images that already had a result (not replaced)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (image, reason)
    cancelled: bool = False


@dataclass(frozen=True)
class PassFailed:
    """The pass stopped: the model could not be loaded or failed on an image. `message` is for a user."""

    message: str
    traceback: str = ""


PassEvent = PassStarted | PassStatus | DownloadProgress | ImageDone | ImageSkipped | PassFinished | PassFailed


class SkipImage(Exception):
    """Raised by a task for one image it cannot handle (unreadable file, unwritable result): named and skipped."""


class ModelLoadError(Exception):
    """Raised by a task whose model cannot be loaded: the message is shown as it is."""


class ImageTask(Protocol):
    """What a pass runs: decide which images need work, load the model, handle one image, release the model."""

    what: str  # shown in the progress line: "masks (CLIPSEG)"

    def needs_work(self, image: Path) -> bool: ...

    def load(self) -> None: ...

    def process(self, image: Path) -> Path:
        """Handle one image and return the file written; raise SkipImage for an image that cannot be handled."""
        ...

    def release(self) -> None: ...


class PassControl:
    """The window's (or Ctrl+C's) way into a running pass: cancel takes effect between images."""

    def __init__(self) -> None:
        self._cancel = threading.Event()

    def cancel(self) -> None:
        self._cancel.set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()


def folder_images(folder: str | Path, include_subdirectories: bool = False) -> list[Path]:
    """The training images of a folder (masks and conditioning images excluded), sorted."""
    if not str(folder).strip():
        raise FileNotFoundError("choose a folder of images")
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        raise FileNotFoundError(f"the folder {folder} does not exist")
    return list_images(folder, include_subdirectories)


def run_pass(
    task: ImageTask,
    images: Sequence[Path],
    sinks: Sequence[EventSink] = (),
    control: PassControl | None = None,
) -> PassFinished | PassFailed:
    """Run `task` over `images`, reporting to `sinks`. Never raises: a failure is the returned (and emitted) event."""
    emit = Broadcast(list(sinks)).emit
    control = control or PassControl()
    todo = [Path(p) for p in images if task.needs_work(Path(p))]
    chosen = set(todo)
    kept = [str(p) for p in images if Path(p) not in chosen]
    emit(PassStarted(task.what, len(todo), len(kept)))
    written: list[str] = []
    skipped: list[tuple[str, str]] = []
    loaded = False
    try:
        if todo and not control.cancelled:
            emit(PassStatus(f"loading the model for {task.what} (a first use downloads it)"))
            loaded = True  # released below even when loading stops half-way
            if not _load(task, emit, control):
                loaded = False  # still loading on its own thread, which releases the model when it arrives
                raise DownloadCancelled("cancelled while the model loaded")
        started = time.monotonic()
        for number, image in enumerate(todo, start=1):
            if control.cancelled:
                break
            try:
                result = task.process(image)
            except SkipImage as e:
                skipped.append((str(image), str(e)))
                emit(ImageSkipped(number, len(todo), str(image), str(e)))
                continue
            written.append(str(result))
            elapsed = time.monotonic() - started
            eta = elapsed / number * (len(todo) - number)
            emit(ImageDone(number, len(todo), str(image), str(result), eta))
    except DownloadCancelled:
        pass  # finished below, as cancelled
    except ModelLoadError as e:
        return _failed(emit, str(e), "")
    except Exception as e:
        return _failed(emit, f"{task.what} failed: {type(e).__name__}: {e}", traceback.format_exc())
    finally:
        if loaded:
            _release(task)
    finished = PassFinished(written, kept, skipped, cancelled=control.cancelled)
    emit(finished)
    return finished


_LOAD_POLL_S = 0.05


def _load(task: ImageTask, emit, control: PassControl) -> bool:
    """Load the task's model on a helper thread and wait for it, or for Cancel: False when cancelled first.

    Reading weights (or a library's download retries) cannot be interrupted, so a cancelled load is left to finish
    on its own daemon thread and releases the model there; the pass ends at once. A download in progress stops at
    its next chunk (`downloads.progress_bar`). A load's error is raised here, as if the load ran on this thread.
    """
    lock = threading.Lock()
    done = threading.Event()
    abandoned = False
    errors: list[BaseException] = []

    def work() -> None:
        try:
            with reported(emit, lambda: control.cancelled):
                task.load()
        except BaseException as e:  # handed to the pass thread, which decides what it means
            errors.append(e)
        with lock:
            done.set()
            release = abandoned
        if release:
            _release(task)

    threading.Thread(target=work, name="onetrainer-tool-load", daemon=True).start()
    while not done.wait(_LOAD_POLL_S):
        if control.cancelled:
            with lock:
                if not done.is_set():
                    abandoned = True
                    return False
    if errors:
        raise errors[0]
    return True


def _failed(emit, message: str, details: str) -> PassFailed:
    failed = PassFailed(message, details)
    emit(failed)
    return failed


def _release(task: ImageTask) -> None:
    """Drop the model and hand its memory back (VRAM too: the app may train next)."""
    task.release()
    gc.collect()
    if "torch" in sys.modules:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()


class ConsolePassSink:
    """A tqdm bar and readable lines on stderr for the scripts."""

    def __init__(self, stream=None) -> None:
        self.stream = stream or sys.stderr
        self._bar = None

    def emit(self, event: PassEvent) -> None:
        if isinstance(event, PassStarted):
            note = f" ({event.kept} kept: they already have one)" if event.kept else ""
            self._write(f"{event.what}: {event.total} images{note}")
            if event.total:
                from tqdm import tqdm

                self._bar = tqdm(total=event.total, file=self.stream, unit="image", dynamic_ncols=True)
        elif isinstance(event, PassStatus):
            self._write(event.text)
        elif isinstance(event, DownloadProgress):
            pass  # the downloader's own tqdm bar shows it in the terminal
        elif isinstance(event, ImageDone | ImageSkipped):
            if isinstance(event, ImageSkipped):
                self._write(f"skipped {event.path}: {event.reason}")
            if self._bar is not None:
                self._bar.update(event.done - self._bar.n)
        elif isinstance(event, PassFinished):
            self.close()
            text = f"{len(event.written)} written, {len(event.kept)} kept, {len(event.skipped)} skipped"
            self._write(("cancelled: " if event.cancelled else "done: ") + text)
        elif isinstance(event, PassFailed):
            self.close()
            self._write(f"error: {event.message}")

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def _write(self, text: str) -> None:
        if self._bar is not None:
            self._bar.write(text, file=self.stream)
        else:
            print(text, file=self.stream, flush=True)


class PassThread:
    """Runs a pass on a worker thread; the window polls `drain()` from its Tk loop and never blocks on the pass.

    The task is built on the worker thread too (`make_task`), so even importing the model's library stays off the
    Tk thread.
    """

    def __init__(self) -> None:
        self.queue_sink = QueueSink()
        self.control = PassControl()
        self.outcome: PassFinished | PassFailed | None = None
        self._thread: threading.Thread | None = None

    def start(self, make_task, images: Sequence[Path]) -> None:
        if self.is_alive():
            raise RuntimeError("a pass is already running")
        self.queue_sink = QueueSink()
        self.control = PassControl()
        self.outcome = None
        self._thread = threading.Thread(
            target=self._run, args=(make_task, list(images)), name="onetrainer-tool-pass", daemon=True
        )
        self._thread.start()

    def _run(self, make_task, images: list[Path]) -> None:
        try:
            task = make_task()
        except Exception as e:
            self.outcome = PassFailed(str(e) if isinstance(e, ModelLoadError | ValueError) else repr(e))
            self.queue_sink.emit(self.outcome)
            return
        self.outcome = run_pass(task, images, [self.queue_sink], self.control)

    def cancel(self) -> None:
        self.control.cancel()

    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def drain(self) -> list[PassEvent]:
        return self.queue_sink.drain()

    def join(self, timeout: float | None = None) -> bool:
        if self._thread is not None:
            self._thread.join(timeout)
        return not self.is_alive()
