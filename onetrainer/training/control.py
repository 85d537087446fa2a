"""Commands to a running trainer from another thread: stop, sample now, save now, backup now.

The trainer polls them at step boundaries; each request is taken once.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from onetrainer.training.distributed import SyncResult


class TrainingControl:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._abort = threading.Event()
        self._pending: set[str] = set()

    # -- from the GUI / signal handler ----------------------------------------------------------------------------
    def request_stop(self) -> None:
        self._stop.set()

    def request_abort(self) -> None:
        """A second Ctrl+C: the run ends now (the signal handler then raises KeyboardInterrupt in the loop)."""
        self._stop.set()
        self._abort.set()

    def request_sample(self) -> None:
        self._request("sample")

    def request_save(self) -> None:
        self._request("save")

    def request_backup(self) -> None:
        self._request("backup")

    # -- from the trainer -----------------------------------------------------------------------------------------
    @property
    def stop_requested(self) -> bool:
        return self._stop.is_set()

    @property
    def abort_requested(self) -> bool:
        return self._abort.is_set()

    def take(self, command: str) -> bool:
        """True once per request of `command` ("sample", "save", "backup")."""
        with self._lock:
            if command in self._pending:
                self._pending.discard(command)
                return True
            return False

    # -- as `distributed.SyncedControl`, the view a run of several processes reads ---------------------------------
    @property
    def local(self) -> TrainingControl:
        """This process's own commands: one process reads them live, so its view is the control itself."""
        return self

    def update(self, result: SyncResult) -> None:
        """Nothing to keep: one process's `sync` (`distributed.SingleProcess`) takes no command."""

    def _request(self, command: str) -> None:
        with self._lock:
            self._pending.add(command)
