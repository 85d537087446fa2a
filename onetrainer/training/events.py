"""What the trainer reports: small frozen events, and the sinks that receive them.

The trainer only calls `emit(event)`; sinks (TensorBoard, the console, the GUI's queue) decide what to show.
"""

from __future__ import annotations

import contextlib
import queue
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class Started:
    run_name: str
    total_steps: int
    total_epochs: int
    steps_per_epoch: int
    log_path: str = ""
    workspace_dir: str = ""


@dataclass(frozen=True)
class Progress:
    global_step: int
    total_steps: int
    epoch: int  # 0-based epoch being trained
    total_epochs: int
    epoch_step: int  # steps done in this epoch
    steps_per_epoch: int
    steps_per_second: float
    eta_seconds: float | None


@dataclass(frozen=True)
class Metrics:
    global_step: int
    loss: float
    smooth_loss: float
    learning_rates: dict[str, float] = field(default_factory=dict)
    extra: dict[str, float] = field(default_factory=dict)  # other scalars by TensorBoard tag


@dataclass(frozen=True)
class Scalars:
    """Other measurements at a step, by TensorBoard tag (validation losses, …)."""

    global_step: int
    values: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Validated:
    """A validation: its mean loss, its loss per range of the schedule ("t0-250" …) and the run's best so far."""

    global_step: int
    label: str  # where in the run: "epoch 7", "step 45 (epoch 3)"
    loss: float
    ranges: dict[str, float] = field(default_factory=dict)
    best_loss: float = float("nan")
    best_label: str = ""


@dataclass(frozen=True)
class BestCheckpoint:
    """The saved checkpoint (save, backup or final model) with the lowest validation loss of the run changed."""

    path: str
    label: str  # "epoch 7", "step 45 (epoch 3)", "the final model"
    loss: float

    def describe(self) -> str:
        return f"best: {self.label}, loss {self.loss:.4f}"


@dataclass(frozen=True)
class CacheFilled:
    """The cache is ready before training: how many items the run needs, how many had to be encoded, how long it took
    (`kind`: "latents" or "captions")."""

    kind: str
    needed: int
    encoded: int
    seconds: float

    @property
    def per_second(self) -> float:
        return self.encoded / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class CacheProgress:
    """Filling the cache before training, reported when a pass starts and after each entry it writes: `done` of the
    `total` entries this pass encodes (`kind`: "latents" or "captions"), `seconds` since the pass began."""

    kind: str
    done: int
    total: int
    seconds: float

    @property
    def unit(self) -> str:
        """What one entry is, in a user's words: an image (one variation of it) or a caption."""
        return {"latents": "images", "captions": "captions"}.get(self.kind, "entries")

    @property
    def per_second(self) -> float:
        return self.done / self.seconds if self.seconds > 0 else 0.0

    @property
    def eta_seconds(self) -> float | None:
        """The time left at the pass's rate so far; None before its first entry."""
        rate = self.per_second
        return (self.total - self.done) / rate if rate > 0 else None


@dataclass(frozen=True)
class SampleReady:
    global_step: int
    index: int
    prompt: str
    path: str


@dataclass(frozen=True)
class Status:
    text: str


@dataclass(frozen=True)
class Warning_:
    """Something the user should know that does not stop the run."""

    text: str


@dataclass(frozen=True)
class Finished:
    reason: str  # "completed", "stopped", "stopped during caching", "cached", "nothing to do"
    output_path: str = ""
    global_step: int = 0


@dataclass(frozen=True)
class Failed:
    message: str  # what went wrong and what to do, in a user's words
    traceback: str = ""
    log_path: str = ""
    refused: bool = False  # the run never began (the config cannot be trained, another run holds the workspace)

    @property
    def headline(self) -> str:
        """What happened, before the message: a run refused at its start did not fail, it never began."""
        return "Cannot start training" if self.refused else "Training failed"


Event = (
    Started
    | Progress
    | Metrics
    | Scalars
    | Validated
    | BestCheckpoint
    | CacheFilled
    | CacheProgress
    | SampleReady
    | Status
    | Warning_
    | Finished
    | Failed
)


def describe(event: Event) -> str | None:
    """The one line the console, the log file and the GUI's Log window all write for an event; None for the events each
    shows its own way (progress and losses: a bar, a line per step, a line per epoch)."""
    if isinstance(event, Started):
        return (
            f"Training {event.run_name}: {event.total_epochs} epochs x {event.steps_per_epoch} steps "
            f"= {event.total_steps} steps"
        )
    if isinstance(event, CacheProgress):  # the start of a pass; its progress is a bar
        return f"caching {event.kind}: {event.total} {event.unit} to encode" if event.done == 0 else None
    if isinstance(event, SampleReady):
        return f"sample {event.index} ({event.prompt!r}): {event.path}"
    if isinstance(event, Validated):
        ranges = ", ".join(f"{name} {value:.4f}" for name, value in event.ranges.items())
        return (
            f"validation at {event.label}: loss {event.loss:.4f} ({ranges}); "
            f"best so far {event.best_loss:.4f} at {event.best_label}"
        )
    if isinstance(event, BestCheckpoint):
        return f"{event.describe()} ({event.path})"
    if isinstance(event, Status):
        return event.text
    if isinstance(event, Warning_):
        return f"warning: {event.text}"
    if isinstance(event, Finished):
        return f"Finished ({event.reason})" + (f": {event.output_path}" if event.output_path else "")
    if isinstance(event, Failed):
        return f"{event.headline}: {event.message}"
    return None


class EventSink(Protocol):
    def emit(self, event: Event) -> None: ...

    def close(self) -> None: ...


class QueueSink:
    """Hands events to another thread (the GUI polls the queue from its main loop)."""

    def __init__(self, target: queue.Queue | None = None) -> None:
        self.queue: queue.Queue = target if target is not None else queue.Queue()

    def emit(self, event: Event) -> None:
        self.queue.put(event)

    def close(self) -> None:
        pass

    def drain(self) -> list[Event]:
        out = []
        while True:
            try:
                out.append(self.queue.get_nowait())
            except queue.Empty:
                return out


class ListSink:
    """Keeps every event (tests, and summaries)."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def emit(self, event: Event) -> None:
        self.events.append(event)

    def close(self) -> None:
        pass

    def of(self, kind: type) -> list:
        return [e for e in self.events if isinstance(e, kind)]


class Broadcast:
    """Sends each event to several sinks; a failing sink never breaks training."""

    def __init__(self, sinks: list[EventSink]) -> None:
        self.sinks = list(sinks)

    def emit(self, event: Event) -> None:
        for sink in self.sinks:
            try:
                sink.emit(event)
            except Exception as e:  # a display problem must not end a training run
                import logging

                logging.getLogger(__name__).warning("event sink %s failed: %s", type(sink).__name__, e)

    def close(self) -> None:
        for sink in self.sinks:
            with contextlib.suppress(Exception):
                sink.close()


# The events' own names, for a run in another process or on another machine to send them as lines of JSON.
EVENT_TYPES: dict[str, type] = {cls.__name__: cls for cls in Event.__args__}


def event_to_json(event: Event) -> str:
    """One line of JSON: the event's type and its fields (NaN and infinity as JSON5-style literals Python reads)."""
    import dataclasses
    import json

    return json.dumps({"type": type(event).__name__, **dataclasses.asdict(event)}, ensure_ascii=False)


def event_from_json(line: str) -> Event | None:
    """An event from `event_to_json`'s line; None for a line that is none (a type this version does not know)."""
    import dataclasses
    import json

    data = json.loads(line)
    cls = EVENT_TYPES.get(data.pop("type", None)) if isinstance(data, dict) else None
    if cls is None:
        return None
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{key: value for key, value in data.items() if key in names})
