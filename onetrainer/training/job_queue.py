"""A queue of training runs that outlives the app and the machine: `job-queue.json` in the app's folder.

Each entry keeps a copy of its config as it was when queued (packed: the concepts and samples inlined), so editing
the window's config or the files afterwards changes nothing queued. A runner (`scripts/job_queue.py run`, or the
app's queue window) takes the entries one after another and trains each through `run_training`, which holds the
run's workspace lock as any run does; a failed entry is recorded with its reason and the next one starts. One runner
at a time holds the queue (`job-queue.lock` beside the file, the workspace lock's kind of file).

Every change reads the file, changes it and writes it whole, atomically (write then rename: a crash never leaves half
a queue; the file gets the user's umask permissions), holding `job-queue.json.edit` locked meanwhile (an OS file
lock, gone with its process), so the app and the command line can both edit one queue without losing a change. An
entry found "running" whose process is gone (a crash, a reboot) is queued again.

An entry's `kind` says where it trains: "local" (this machine) or "remote" (its config's enabled `cloud` block: the
host's settings travel in the queued config, never a secret, which stays in the secrets file and is read when the run
starts). A remote entry trains on its host as any remote run does (`remote/run.py`), the runner following it.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import socket
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from onetrainer.config import TrainConfig, config_from_dict
from onetrainer.config.io import ConfigFileError, pack, read_json
from onetrainer.config.naming import describe
from onetrainer.config.schema import errors
from onetrainer.training.control import TrainingControl
from onetrainer.training.events import Broadcast, EventSink, Failed, Finished
from onetrainer.util.app_dirs import state_dir
from onetrainer.util.fs import atomic_write_json

QUEUE_NAME = "job-queue.json"
LOCK_NAME = "job-queue.lock"
VERSION = 1
KINDS = ("local", "remote")
QUEUED, RUNNING, FINISHED, STOPPED, FAILED = "queued", "running", "finished", "stopped", "failed"
STATUSES = (QUEUED, RUNNING, FINISHED, STOPPED, FAILED)
DONE = (FINISHED, STOPPED, FAILED)
INTERRUPTED = "interrupted (the app, the queue's runner or the machine stopped during the run): queued again"

TrainFunction = Callable[[TrainConfig, TrainingControl, list[EventSink]], "Finished | Failed"]


class QueueError(Exception):
    """The queue file cannot be read or written, or an entry named does not exist; the message says which."""


class QueueBusy(QueueError):
    """Another process runs the queue."""


def default_queue_path() -> Path:
    return state_dir() / QUEUE_NAME


def _now() -> str:
    return datetime.datetime.now().isoformat(timespec="seconds")


@dataclass
class QueueEntry:
    id: str
    name: str
    config: dict[str, Any]  # the config as queued (TrainConfig.to_dict of the packed copy)
    kind: str = "local"
    status: str = QUEUED
    reason: str = ""  # why it failed, or how it finished ("completed", "stopped", the output's path)
    log_path: str = ""
    source: str = ""  # the config file it came from, or "app"
    added: str = ""
    started: str = ""
    ended: str = ""
    holder: dict[str, Any] | None = field(default=None)  # the process running it (a workspace lock's LockHolder)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any, where: str) -> QueueEntry:
        if not isinstance(data, dict):
            raise QueueError(f"{where} must be a JSON object, not {type(data).__name__}")
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise QueueError(f"{where} has unknown fields: {', '.join(unknown)}")
        for name in ("id", "name", "config"):
            if name not in data:
                raise QueueError(f"{where} lacks its '{name}'")
        if not isinstance(data["config"], dict):
            raise QueueError(f"{where}: 'config' must be a JSON object")
        for name in ("id", "name", "kind", "status", "reason", "log_path", "source", "added", "started", "ended"):
            if name in data and not isinstance(data[name], str):
                raise QueueError(f"{where}: '{name}' must be text, not {data[name]!r}")
        if data.get("kind", "local") not in KINDS:
            raise QueueError(f"{where}: 'kind' must be one of {', '.join(KINDS)}, not {data['kind']!r}")
        if data.get("status", QUEUED) not in STATUSES:
            raise QueueError(f"{where}: 'status' must be one of {', '.join(STATUSES)}, not {data['status']!r}")
        if data.get("holder") is not None and not isinstance(data["holder"], dict):
            raise QueueError(f"{where}: 'holder' must be a JSON object or null")
        return cls(**data)

    def line(self, position: int) -> str:
        """One line of the list: position, status, name, id (and the reason of a failed or stopped run below)."""
        where = ", remote" if self.kind == "remote" else ""
        text = f"{position:>3}. {self.status:<9} {self.name}  ({self.id}{where}, queued {self.added.replace('T', ' ')})"
        if self.reason:  # how it ended, why it failed, or that it was queued again after an interruption
            text += f"\n       {self.reason}"
        if self.log_path and self.status in DONE:
            text += f"\n       log: {self.log_path}"
        return text


def run_kind(config: TrainConfig) -> str:
    """ "remote" for a config whose `cloud` block is enabled (it trains on that host), else "local"."""
    cloud = config.cloud
    return "remote" if isinstance(cloud, dict) and cloud.get("enabled") else "local"


def entry_name(config: TrainConfig, source: str = "") -> str:
    """What the list calls a run: its config file's name, and the model it writes."""
    output = Path(config.output_model_destination).name if config.output_model_destination else ""
    base = Path(source).name if source and source != "app" else ""
    return " → ".join(part for part in (base, output) if part) or "(unnamed config)"


def relative_paths(config: TrainConfig) -> list[str]:
    """The config's folders and files given relative (`workspace_dir=workspace/run`): a queued run resolves them in
    the folder its runner started from, which may not be the folder it was queued from."""
    found = [
        f"{name}={getattr(config, name)}"
        for name in ("workspace_dir", "cache_dir", "output_model_destination")
        if getattr(config, name) and not Path(getattr(config, name)).expanduser().is_absolute()
    ]
    for index, concept in enumerate(config.concepts or []):
        if concept.path and ":" not in concept.path and not Path(concept.path).expanduser().is_absolute():
            found.append(f"concepts.{index}.path={concept.path}")
    return found


def _holder_alive(holder: dict[str, Any]) -> bool:
    from onetrainer.training.workspace import LockHolder, _alive

    try:
        lock = LockHolder(
            int(holder["pid"]),
            str(holder["host"]),
            str(holder.get("started", "")),
            float(holder.get("process_started", 0.0)),
        )
    except (KeyError, TypeError, ValueError):
        return False
    if lock.host != socket.gethostname():
        return True  # another machine's run (a shared home folder): it cannot be asked from here
    return _alive(lock)


def _this_process() -> dict[str, Any]:
    from onetrainer.training.workspace import _process_started

    pid = os.getpid()
    return {"pid": pid, "host": socket.gethostname(), "started": _now(), "process_started": _process_started(pid)}


@contextlib.contextmanager
def _edit_lock(path: Path) -> Iterator[None]:
    """Hold an OS lock on `path` (created when missing) while one process reads, changes and writes the queue: two
    changes at once (the app adds while a terminal's runner records a run) would otherwise lose one of them. The OS
    frees it when the process ends, so a crash never leaves the queue locked."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(path, "a+b")  # noqa: SIM115  (held across the yield)
    except OSError as e:
        raise QueueError(f"cannot lock the queue file for a change ({path}): {e}") from None
    try:
        if os.name == "nt":
            import msvcrt

            handle.seek(0)
            for attempt in range(6):  # LK_LOCK itself retries for 10 s
                try:
                    msvcrt.locking(handle.fileno(), msvcrt.LK_LOCK, 1)
                    break
                except OSError as e:
                    if attempt == 5:
                        raise QueueError(f"the queue file stayed locked for a minute ({path}): {e}") from None
        else:
            import fcntl

            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        yield
    finally:
        handle.close()  # closing the file releases its lock


class JobQueue:
    """The queue in one file. Each method reads the file afresh and writes what it changed."""

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path is not None else default_queue_path()

    # -- the file --------------------------------------------------------------------------------------------------

    def entries(self) -> list[QueueEntry]:
        """The entries in their order; a running entry whose process is gone reads as queued again."""
        if not self.path.exists():
            return []
        try:
            data = read_json(self.path, "queue file")
        except ConfigFileError as e:
            raise QueueError(str(e)) from None
        if not isinstance(data, dict) or not isinstance(data.get("entries"), list):
            raise QueueError(f"the queue file {self.path} must hold a JSON object with a list 'entries'")
        if data.get("version", VERSION) != VERSION:
            raise QueueError(
                f"the queue file {self.path} has version {data.get('version')!r}; this app reads {VERSION}"
            )
        out = []
        for index, item in enumerate(data["entries"]):
            entry = QueueEntry.from_dict(item, f"the queue file {self.path}: entry {index + 1}")
            if entry.status == RUNNING and not (entry.holder and _holder_alive(entry.holder)):
                entry.status, entry.reason, entry.holder, entry.started = QUEUED, INTERRUPTED, None, ""
            out.append(entry)
        return out

    def _write(self, entries: list[QueueEntry]) -> None:
        try:
            atomic_write_json(self.path, {"version": VERSION, "entries": [e.to_dict() for e in entries]})
        except OSError as e:
            raise QueueError(f"cannot write the queue file {self.path}: {e}") from None

    @contextlib.contextmanager
    def _editing(self) -> Iterator[list[QueueEntry]]:
        with _edit_lock(self.path.with_name(self.path.name + ".edit")):
            entries = self.entries()
            yield entries
            self._write(entries)

    # -- what the list and the footer show -------------------------------------------------------------------------

    def waiting(self) -> list[QueueEntry]:
        return [e for e in self.entries() if e.status == QUEUED]

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(STATUSES, 0)
        for entry in self.entries():
            out[entry.status] += 1
        return out

    def find(self, ref: str | int, entries: list[QueueEntry] | None = None) -> tuple[int, QueueEntry]:
        """An entry by its position in the list (1 is the first) or its id (or the start of it)."""
        entries = self.entries() if entries is None else entries
        text = str(ref).strip()
        if text.isdigit():
            position = int(text)
            if not 1 <= position <= len(entries):
                raise QueueError(f"there is no entry {position}: the queue has {len(entries)}")
            return position - 1, entries[position - 1]
        found = [(i, e) for i, e in enumerate(entries) if e.id.startswith(text)] if text else []
        if len(found) == 1:
            return found[0]
        if not found:
            raise QueueError(f"no entry of the queue has the id '{text}' (see the list for the ids)")
        raise QueueError(f"'{text}' is the start of {len(found)} ids: give more of it")

    # -- changes ---------------------------------------------------------------------------------------------------

    def add(self, config: TrainConfig, name: str = "", source: str = "", kind: str | None = None) -> QueueEntry:
        """Queue a copy of `config` (packed: the concepts and samples files' contents are copied too); `kind` None:
        where the config trains (`run_kind`)."""
        kind = kind or run_kind(config)
        if kind not in KINDS:
            raise QueueError(f"kind must be one of {', '.join(KINDS)}, not {kind!r}")
        packed, _ = pack(config)
        entry = QueueEntry(
            id="q" + uuid.uuid4().hex[:8],
            name=name or entry_name(config, source),
            config=packed.to_dict(),
            kind=kind,
            source=source,
            added=_now(),
        )
        with self._editing() as entries:
            entries.append(entry)
        return entry

    def remove(self, ref: str | int) -> QueueEntry:
        with self._editing() as entries:
            index, entry = self.find(ref, entries)
            if entry.status == RUNNING:
                raise QueueError(f"entry {index + 1} ({entry.name}) is running: stop it first")
            del entries[index]
        return entry

    def move(self, ref: str | int, position: int) -> QueueEntry:
        """Move an entry to `position` (1 is the first; beyond the end is the end)."""
        with self._editing() as entries:
            index, entry = self.find(ref, entries)
            del entries[index]
            entries.insert(min(max(position, 1), len(entries) + 1) - 1, entry)
        return entry

    def requeue(self, ref: str | int) -> QueueEntry:
        """Queue a finished, stopped or failed entry again (its config as it was queued)."""
        with self._editing() as entries:
            index, entry = self.find(ref, entries)
            if entry.status == RUNNING:
                raise QueueError(f"entry {index + 1} ({entry.name}) is running")
            entry.status, entry.reason, entry.log_path, entry.started, entry.ended = QUEUED, "", "", "", ""
        return entry

    def clear_done(self) -> int:
        """Remove the finished, stopped and failed entries; how many."""
        with self._editing() as entries:
            done = [e for e in entries if e.status in DONE]
            entries[:] = [e for e in entries if e.status not in DONE]
        return len(done)

    # -- running ---------------------------------------------------------------------------------------------------

    def claim_next(self) -> QueueEntry | None:
        """The first queued entry, now marked running by this process; None when none waits."""
        with self._editing() as entries:
            entry = next((e for e in entries if e.status == QUEUED), None)
            if entry is not None:
                entry.status, entry.reason, entry.started, entry.ended = RUNNING, "", _now(), ""
                entry.holder = _this_process()
        return entry

    def record(self, entry_id: str, outcome: Finished | Failed) -> QueueEntry | None:
        """Write a run's outcome into its entry (None when the entry was removed meanwhile)."""
        with self._editing() as entries:
            entry = next((e for e in entries if e.id == entry_id), None)
            if entry is None:
                return None
            entry.holder, entry.ended = None, _now()
            if isinstance(outcome, Failed):
                from onetrainer.training.console import ABORTED

                entry.status = STOPPED if outcome.message == ABORTED else FAILED
                entry.reason, entry.log_path = outcome.message, outcome.log_path
            else:
                entry.status = STOPPED if outcome.reason.startswith("stopped") else FINISHED
                entry.reason = outcome.reason + (f": {outcome.output_path}" if outcome.output_path else "")
        return entry


@dataclass
class QueueRunnerLock:
    """The one process that runs the queue holds `job-queue.lock` (released when it ends, or found dead)."""

    lock: Any

    @classmethod
    def acquire(cls, queue: JobQueue) -> QueueRunnerLock:
        from onetrainer.training.workspace import WorkspaceBusy, WorkspaceLock, read_lock

        folder = queue.path.parent
        try:
            return cls(WorkspaceLock.acquire(folder, LOCK_NAME))
        except WorkspaceBusy:
            holder = read_lock(folder / LOCK_NAME)
            who = holder.describe() if holder is not None else "another process"
            raise QueueBusy(
                f"the queue {queue.path} is being run by {who}: its runs go one after another, so a second runner "
                "would only compete with it. Add to the queue instead; that runner takes the new entries too."
            ) from None
        except OSError as e:
            raise QueueError(f"cannot lock the queue in {folder}: {e}") from None

    def release(self) -> None:
        self.lock.release()


def entry_config(entry: QueueEntry) -> TrainConfig | Failed:
    """The entry's config as queued, or the refusal when it no longer loads (a config of another version)."""
    config, problems = config_from_dict(entry.config)
    if errors(problems):
        return Failed(
            "The queued config cannot be trained:\n" + "\n".join(describe(p, config) for p in errors(problems)),
            refused=True,
        )
    return config


def run_entry(entry: QueueEntry, control: TrainingControl, sinks: list[EventSink], train: TrainFunction | None = None):
    """Train one entry's config as queued; never raises (a config that no longer loads is a failed run)."""
    config = entry_config(entry)
    if isinstance(config, Failed):
        events = Broadcast(sinks)
        events.emit(config)
        events.close()
        return config
    if train is None:
        from onetrainer.training.runner import run_training as train
    return train(config, control, sinks)


@dataclass
class QueueRun:
    """What one `run_queue` did: each entry it took, with its outcome, in order."""

    done: list[tuple[QueueEntry, Finished | Failed]] = field(default_factory=list)
    stopped: bool = False  # a stop was asked for: the entries left stay queued

    @property
    def failed(self) -> list[QueueEntry]:
        return [entry for entry, outcome in self.done if entry.status == FAILED]


def run_queue(
    queue: JobQueue,
    *,
    new_control: Callable[[QueueEntry], TrainingControl] = lambda entry: TrainingControl(),
    sinks: Callable[[QueueEntry], list[EventSink]] = lambda entry: [],
    on_start: Callable[[QueueEntry, int], None] = lambda entry, left: None,
    on_end: Callable[[QueueEntry, Finished | Failed], None] = lambda entry, outcome: None,
    train: TrainFunction | None = None,
) -> QueueRun:
    """Train the queued entries one after another until none waits (entries added meanwhile included). A failed run
    is recorded and the next starts; a run stopped on request (its control) ends the queue's run, the rest stay
    queued. A KeyboardInterrupt (the second Ctrl+C) records the run as stopped and is raised again.
    Raises QueueBusy when another process runs the queue."""
    result = QueueRun()
    runner_lock = QueueRunnerLock.acquire(queue)
    try:
        while True:
            entry = queue.claim_next()
            if entry is None:
                return result
            control = new_control(entry)
            on_start(entry, len(queue.waiting()))
            try:
                outcome = run_entry(entry, control, sinks(entry), train)
            except KeyboardInterrupt:
                from onetrainer.training.console import ABORTED

                queue.record(entry.id, Failed(ABORTED))
                raise
            recorded = queue.record(entry.id, outcome) or entry
            result.done.append((recorded, outcome))
            on_end(recorded, outcome)
            if control.stop_requested or control.abort_requested:
                result.stopped = True
                return result
    finally:
        runner_lock.release()
