"""Training in a background thread: events come back through a queue, commands go out through the control.

The thread never touches a widget. The app polls `drain()` from its Tk main loop (`after`), and notices the end of a
run by the thread finishing, so even a training function that forgets its final event cannot hang the window.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import traceback
from collections.abc import Callable

from onetrainer.config import TrainConfig
from onetrainer.training.control import TrainingControl
from onetrainer.training.events import Event, EventSink, Failed, Finished, QueueSink

TrainFunction = Callable[[TrainConfig, TrainingControl, list[EventSink]], "Finished | Failed"]


def default_train_function() -> TrainFunction:
    # Imported late: the training module pulls in more than the window needs to open.
    from onetrainer.training.runner import run_training

    return run_training


class TrainingRunner:
    def __init__(
        self,
        train_function: TrainFunction | None = None,
        limit_threads: bool = True,
        extra_sinks: Callable[[], list[EventSink]] = list,
    ) -> None:
        self.train_function = train_function
        self._limit_threads = limit_threads
        self.extra_sinks = extra_sinks  # e.g. the terminal's progress bar when the app was started from one
        self.queue: queue.Queue[Event] = queue.Queue()
        self.control: TrainingControl | None = None
        self.config: TrainConfig | None = None  # the running (or last) run's copy
        self.outcome: Finished | Failed | None = None
        self._thread: threading.Thread | None = None

    def start(self, config: TrainConfig) -> None:
        """Train `config` (the caller's own copy: the thread reads it while the window goes on editing another)."""
        if self.is_alive():
            raise RuntimeError("a training run is already in progress")
        self.queue = queue.Queue()
        self.control = TrainingControl()
        self.config = config
        self.outcome = None
        train = self.train_function or default_train_function()
        self._thread = threading.Thread(
            target=self._run,
            args=(train, config, self.control, self.queue, self.extra_sinks()),
            name="onetrainer-training",
            daemon=True,
        )
        self._thread.start()

    def _run(
        self,
        train: TrainFunction,
        config: TrainConfig,
        control: TrainingControl,
        events: queue.Queue,
        extra: list[EventSink],
    ) -> None:
        try:
            threads = contextlib.nullcontext()
            if self._limit_threads:
                # Imported here: torch loads with the first run, not with the window. All cores but one train, so
                # the window stays responsive.
                from onetrainer.training.devices import torch_threads, training_threads

                threads = torch_threads(training_threads())
            with threads:
                self.outcome = train(config, control, [QueueSink(events), *extra])
        except Exception as e:  # run_training never raises; a replacement might, and the window must hear of it
            self.outcome = Failed(f"{type(e).__name__}: {e}", traceback.format_exc())
            events.put(self.outcome)

    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def drain(self) -> list[Event]:
        out: list[Event] = []
        while True:
            try:
                out.append(self.queue.get_nowait())
            except queue.Empty:
                return out

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the thread (at most `timeout` seconds); True when it has ended."""
        if self._thread is not None:
            self._thread.join(timeout)
        return not self.is_alive()

    # -- commands, taken by the trainer at its next step boundary ------------------------------------------------

    def request_stop(self) -> None:
        if self.control is not None:
            self.control.request_stop()

    def request_sample(self) -> None:
        if self.control is not None:
            self.control.request_sample()

    def request_save(self) -> None:
        if self.control is not None:
            self.control.request_save()

    def request_backup(self) -> None:
        if self.control is not None:
            self.control.request_backup()
