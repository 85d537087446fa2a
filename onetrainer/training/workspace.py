"""A run's workspace: `workspace_dir/{config,logs,samples,tensorboard,backup,save}`, its name and its log file."""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import re
import socket
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path

from onetrainer.training.events import (
    Event,
    Failed,
    Metrics,
    Progress,
    Scalars,
    describe,
)

SUBDIRS = ("config", "logs", "samples", "tensorboard", "backup", "save")


@dataclass(frozen=True)
class Workspace:
    root: Path
    run_name: str

    @classmethod
    def create(cls, workspace_dir: str, prefix: str = "") -> Workspace:
        root = Path(workspace_dir).expanduser()
        for sub in SUBDIRS:
            (root / sub).mkdir(parents=True, exist_ok=True)
        stamp = datetime.datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
        name = f"{prefix}{stamp}"
        # Two runs started in the same second must not share a log or TensorBoard folder.
        suffix = 1
        while (root / "logs" / f"{name}.log").exists():
            suffix += 1
            name = f"{prefix}{stamp}-{suffix}"
        return cls(root, name)

    def dir(self, sub: str) -> Path:
        return self.root / sub

    @property
    def log_path(self) -> Path:
        return self.root / "logs" / f"{self.run_name}.log"

    @property
    def tensorboard_dir(self) -> Path:
        return self.root / "tensorboard" / self.run_name

    @property
    def config_path(self) -> Path:
        return self.root / "config" / f"{self.run_name}.json"


LOCK_NAME = "training.lock"


@dataclass(frozen=True)
class LockHolder:
    """Who holds a workspace: written into its lock file as JSON."""

    pid: int
    host: str
    started: str  # local time, ISO 8601, to the second
    process_started: float = 0.0  # the process's start time (psutil), to tell a reused pid from the holder

    def describe(self) -> str:
        return f"process {self.pid} on {self.host}, started {self.started.replace('T', ' ')}"


class WorkspaceBusy(Exception):
    """Another run trains in this workspace; the message names it and what to do."""


def _process_started(pid: int) -> float:
    """The process's start time (seconds since the epoch), or 0 when it cannot be read."""
    try:
        import psutil

        return float(psutil.Process(pid).create_time())
    except Exception:  # no psutil, no such process, or no access: the pid alone decides
        return 0.0


def _alive(holder: LockHolder) -> bool:
    """Whether the lock's process still runs (a pid reused by another program since does not count)."""
    if holder.pid <= 0:
        return False
    try:
        import psutil
    except ImportError:
        psutil = None
    if psutil is not None:
        if not psutil.pid_exists(holder.pid):
            return False
        started = _process_started(holder.pid)
        return not (holder.process_started and started and abs(started - holder.process_started) > 1.0)
    if os.name == "nt":
        return True  # without psutil there is no safe probe on Windows (os.kill would end the process)
    try:
        os.kill(holder.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class WorkspaceLock:
    """`training.lock` in a workspace: one run at a time writes its samples, logs, TensorBoard events and backups.

    The lock file holds the holder's pid, host and start time. It is created atomically with its content (a hard link
    of a finished temporary file, so a reader never sees half of it); a lock whose process is gone (a crash, a
    killed run) is taken over, so a dead run never leaves its workspace locked. A lock from another host cannot be
    checked: it is refused, and the message says which file to delete once that run is known to be over.
    """

    def __init__(self, path: Path, holder: LockHolder) -> None:
        self.path = path
        self.holder = holder
        self.taken_over: LockHolder | None = None  # the dead run whose lock was taken over

    @classmethod
    def acquire(cls, workspace_dir: str | Path, name: str = LOCK_NAME) -> WorkspaceLock:
        """Hold `workspace_dir`'s lock file `name` (another name: the same kind of lock on something else, e.g. the
        queue of runs' `job-queue.lock`)."""
        root = Path(workspace_dir).expanduser().absolute()  # named in full: a relative one depends on the start folder
        root.mkdir(parents=True, exist_ok=True)
        path = root / name
        pid = os.getpid()
        holder = LockHolder(
            pid, socket.gethostname(), datetime.datetime.now().isoformat(timespec="seconds"), _process_started(pid)
        )
        lock = cls(path, holder)
        for _ in range(20):  # each round either takes the lock, refuses, or removes a dead run's lock
            if _create_exclusive(path, json.dumps(asdict(holder))):
                return lock
            current = read_lock(path)
            if current is None:  # just released, or being replaced: look again
                time.sleep(0.05)
                continue
            if current.host != holder.host or _alive(current):
                raise WorkspaceBusy(busy_message(root, current, path, current.host != holder.host))
            if _remove_if_unchanged(path, current):
                lock.taken_over = current
        raise WorkspaceBusy(f"the workspace {root} is locked by {path}, which keeps changing: another run is starting")

    def release(self) -> None:
        """Remove the lock if it is still this run's (never another run's that took over a lock thought dead)."""
        current = read_lock(self.path)
        if current is not None and (current.pid, current.host, current.started) == (
            self.holder.pid,
            self.holder.host,
            self.holder.started,
        ):
            with contextlib.suppress(OSError):
                self.path.unlink()


def busy_message(root: Path, holder: LockHolder, path: Path, other_host: bool) -> str:
    remedy = (
        f"If that run is over (its machine cannot be asked from here), delete {path}."
        if other_host
        else "Wait for it to finish, stop it, or set another workspace_dir for this run."
    )
    return (
        f"another run is training in the workspace {root} ({holder.describe()}): two runs would write their samples, "
        f"logs, TensorBoard events and backups into the same folders. {remedy}"
    )


def read_lock(path: Path) -> LockHolder | None:
    """The lock's holder; None when there is no lock. A damaged lock reads as held by an unknown, dead process."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError:
        text = ""
    try:
        data = json.loads(text)
        return LockHolder(
            int(data["pid"]), str(data["host"]), str(data["started"]), float(data.get("process_started", 0.0))
        )
    except (ValueError, KeyError, TypeError):
        # Written with its content in one step, so an unreadable lock is damaged, not half-written: taken over.
        return LockHolder(0, socket.gethostname(), "(unreadable lock)")


def _create_exclusive(path: Path, text: str) -> bool:
    """Create `path` with `text` unless it exists; False when it exists."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{time.monotonic_ns()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    try:
        os.link(tmp, path)  # atomic, and fails when the lock exists: the lock appears with its content
        return True
    except FileExistsError:
        return False
    except OSError:  # a file system without hard links: exclusive create, then write
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        return True
    finally:
        tmp.unlink(missing_ok=True)


def _remove_if_unchanged(path: Path, seen: LockHolder) -> bool:
    """Remove a dead run's lock, unless another run took it over since it was read (then it is left alone)."""
    moved = path.with_name(f".{path.name}.{os.getpid()}.stale")
    try:
        os.replace(path, moved)
    except FileNotFoundError:
        return False
    if read_lock(moved) != seen:  # another run's fresh lock: put it back where it was
        if not _link_back(moved, path):
            moved.unlink(missing_ok=True)
        return False
    moved.unlink(missing_ok=True)
    return True


def _link_back(moved: Path, path: Path) -> bool:
    try:
        os.link(moved, path)
    except OSError:
        return False
    moved.unlink(missing_ok=True)
    return True


class _QuietStreamHandler(logging.StreamHandler):
    def handleError(self, record: logging.LogRecord) -> None:
        pass  # a log file that cannot be written (disk full) must not print logging's own traceback on every line


def safe_name(text: str, limit: int = 60) -> str:
    """A prompt made safe as a folder name on every platform."""
    cleaned = re.sub(r'[<>:"/\\|?*\x00-\x1f]', "", text).strip().strip(".")
    return (cleaned[:limit].rstrip() or "sample").replace("  ", " ")


class LogFileSink:
    """Writes everything the console shows (and library warnings and tracebacks) to the run's log file."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.file = path.open("a", encoding="utf-8")
        # Written and flushed now, so that a full disk is an error at start rather than a failing sink later.
        self.file.write(f"[{datetime.datetime.now():%H:%M:%S}] log of {path.stem}\n")
        self.file.flush()
        self._last_progress = -1
        self._flushed = time.monotonic()
        self._stamp_second, self._stamp_text = -1, ""
        self.failed = False
        self.handler = _QuietStreamHandler(self.file)
        self.handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        self.handler.setLevel(logging.INFO)
        logging.getLogger().addHandler(self.handler)
        logging.captureWarnings(True)

    def emit(self, event: Event) -> None:
        text = self._text(event)
        if text and not self.failed:
            try:
                self.file.write(f"{self._stamp()} {text}\n")
                # A step's line waits up to a second for the next flush (a flush per step costs a system call each);
                # every other line is on disk at once.
                if not isinstance(event, Metrics | Scalars) or time.monotonic() - self._flushed >= 1.0:
                    self.file.flush()
                    self._flushed = time.monotonic()
            except OSError as e:  # the disk filled up during the run: say so once, training goes on
                self.failed = True
                logging.getLogger(__name__).warning("the log %s cannot be written any more: %s", self.path, e)

    def _stamp(self) -> str:
        """ "[HH:MM:SS]" of now, formatted once a second (a line per step would format it every step)."""
        now = time.time()
        if int(now) != self._stamp_second:
            self._stamp_second = int(now)
            self._stamp_text = time.strftime("[%H:%M:%S]", time.localtime(now))
        return self._stamp_text

    def _text(self, event: Event) -> str | None:
        if isinstance(event, Progress):
            return None  # the loss lines below carry the step
        if isinstance(event, Metrics):
            rates = " ".join(f"lr/{k}={v:.3g}" for k, v in event.learning_rates.items())
            return f"step {event.global_step}: loss={event.loss:.6f} smooth={event.smooth_loss:.6f} {rates}"
        if isinstance(event, Scalars):
            return f"step {event.global_step}: " + " ".join(f"{k}={v:.6f}" for k, v in event.values.items())
        if isinstance(event, Failed):
            return f"{describe(event)}\n{event.traceback}".rstrip()
        return describe(event)

    def write_exception(self) -> None:
        self.file.write(traceback.format_exc())
        self.file.flush()

    def close(self) -> None:
        logging.getLogger().removeHandler(self.handler)
        logging.captureWarnings(False)
        self.file.close()
