"""The console sink: a progress bar and readable status lines for the command line."""

from __future__ import annotations

import sys

from onetrainer.training.events import (
    Event,
    Failed,
    Finished,
    Metrics,
    Progress,
    Started,
    describe,
)


class ConsoleSink:
    def __init__(self, stream=None) -> None:
        self.stream = stream or sys.stderr
        self._bar = None
        self._loss: float | None = None
        self._gone = False

    def emit(self, event: Event) -> None:
        if self._gone:
            return
        try:
            self._show(event)
        except (OSError, ValueError):  # the terminal is gone (SIGHUP, a closed SSH session): the log still has it all
            self._gone = True

    def _show(self, event: Event) -> None:
        if isinstance(event, Progress):
            if self._bar is not None:
                self._bar.n = event.global_step
                postfix = {"epoch": f"{event.epoch + 1}/{event.total_epochs}"}
                if self._loss is not None:
                    postfix["loss"] = f"{self._loss:.4f}"
                self._bar.set_postfix(postfix, refresh=False)
                self._bar.refresh()
            return
        if isinstance(event, Metrics):
            self._loss = event.smooth_loss
            return
        if isinstance(event, Finished | Failed):
            self._close_bar()
            if isinstance(event, Failed):
                return  # the caller prints the failure with the log's path
        text = describe(event)
        if text is not None:
            self._write(text)
        if isinstance(event, Started):
            self._open_bar(event.total_steps)

    def close(self) -> None:
        self._close_bar()

    def _open_bar(self, total: int) -> None:
        from tqdm import tqdm

        self._bar = tqdm(total=total, unit="step", file=self.stream, dynamic_ncols=True, leave=True)

    def _close_bar(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def _write(self, text: str) -> None:
        if self._bar is not None:
            self._bar.write(text, file=self.stream)
        else:
            print(text, file=self.stream, flush=True)
