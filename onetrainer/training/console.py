"""The console sink: a progress bar and readable status lines for the command line (and for the terminal the app was
started from)."""

from __future__ import annotations

import sys

from onetrainer.training.events import (
    CacheProgress,
    Event,
    Failed,
    Finished,
    Metrics,
    Progress,
    Started,
    describe,
)

ABORTED = "aborted by a second interrupt (Ctrl+C): nothing was saved after the last backup"


def failure_lines(event: Failed) -> list[str]:
    """What a terminal shows for a failed run: the failure, then the log with its traceback."""
    if event.message == ABORTED:
        return [f"Training aborted: {event.message}"]
    lines = [describe(event)]
    if event.log_path:
        lines.append(f"The log {'with the full traceback' if event.traceback else 'of the run'}: {event.log_path}")
    return lines


def write_line(stream, text: str) -> None:
    """A line on `stream`, flushed; a stream that cannot encode a character gets it escaped rather than nothing.
    OSError / ValueError (a closed terminal) are the caller's to handle."""
    try:
        print(text, file=stream, flush=True)
    except UnicodeEncodeError:
        encoding = getattr(stream, "encoding", None) or "ascii"
        print(text.encode(encoding, "backslashreplace").decode(encoding), file=stream, flush=True)


class ConsoleSink:
    """The run on a terminal (or wherever stderr goes): status lines, a progress bar, and at the end the outcome —
    a failure and its log's path included, after the bar is closed, so that they are the last lines shown."""

    def __init__(self, stream=None) -> None:
        self.stream = stream or sys.stderr
        self._bar = None
        self._metrics: Metrics | None = None
        self._gone = False

    def emit(self, event: Event) -> None:
        if self._gone:
            return
        try:
            self._show(event)
        except UnicodeEncodeError:  # a stream that cannot show a character of this line: the next lines still come
            pass
        except (OSError, ValueError):  # the terminal is gone (SIGHUP, a closed SSH session): the log still has it all
            self._gone = True

    def _show(self, event: Event) -> None:
        if isinstance(event, CacheProgress) and event.done > 0:
            if self._bar is not None:
                self._bar.update(event.done - self._bar.n)
                if event.done >= event.total:
                    self._close_bar()
            return
        if isinstance(event, Progress):
            if self._bar is not None:
                self._bar.n = event.global_step
                postfix = {"epoch": f"{event.epoch + 1}/{event.total_epochs}"}
                if self._metrics is not None:  # the step's loss and its smoothed value, named as the app's footer
                    postfix["loss"] = f"{self._metrics.loss:.4f}"
                    postfix["smooth"] = f"{self._metrics.smooth_loss:.4f}"
                self._bar.set_postfix(postfix, refresh=False)
                self._bar.refresh()
            return
        if isinstance(event, Metrics):
            self._metrics = event
            return
        if isinstance(event, Finished | Failed):
            self._close_bar()
            if isinstance(event, Failed):
                for line in failure_lines(event):
                    write_line(self.stream, line)
                return
        text = describe(event)
        if text is not None:
            self._write(text)
        if isinstance(event, Started):
            self._open_bar(event.total_steps, "step")
        elif isinstance(event, CacheProgress):  # a cache pass starts: a bar of its own, closed when it ends
            self._open_bar(event.total, event.unit.removesuffix("s"), f"caching {event.kind}")

    def close(self) -> None:
        try:
            self._close_bar()
        except (OSError, ValueError):
            self._bar = None

    def _open_bar(self, total: int, unit: str, description: str | None = None) -> None:
        from tqdm import tqdm

        self._close_bar()
        self._bar = tqdm(total=total, unit=unit, desc=description, file=self.stream, dynamic_ncols=True, leave=True)

    def _close_bar(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def _write(self, text: str) -> None:
        if self._bar is not None:
            self._bar.write(text, file=self.stream)
        else:
            write_line(self.stream, text)
