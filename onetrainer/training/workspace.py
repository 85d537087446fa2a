"""A run's workspace: `workspace_dir/{config,logs,samples,tensorboard,backup,save}`, its name and its log file."""

from __future__ import annotations

import datetime
import logging
import re
import traceback
from dataclasses import dataclass
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
        self.failed = False
        self.handler = _QuietStreamHandler(self.file)
        self.handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        self.handler.setLevel(logging.INFO)
        logging.getLogger().addHandler(self.handler)
        logging.captureWarnings(True)

    def emit(self, event: Event) -> None:
        text = self._text(event)
        if text and not self.failed:
            stamp = datetime.datetime.now().strftime("%H:%M:%S")
            try:
                self.file.write(f"[{stamp}] {text}\n")
                self.file.flush()
            except OSError as e:  # the disk filled up during the run: say so once, training goes on
                self.failed = True
                logging.getLogger(__name__).warning("the log %s cannot be written any more: %s", self.path, e)

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
