"""The console sink: a progress bar and readable status lines for the command line."""

from __future__ import annotations

import sys

from onetrainer.training.events import (
    Event,
    Failed,
    Finished,
    Metrics,
    Progress,
    SampleReady,
    Started,
    Status,
    Warning_,
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
        if isinstance(event, Started):
            self._write(
                f"Training {event.run_name}: {event.total_epochs} epochs x {event.steps_per_epoch} steps "
                f"= {event.total_steps} steps"
            )
            self._open_bar(event.total_steps)
        elif isinstance(event, Progress):
            if self._bar is not None:
                self._bar.n = event.global_step
                postfix = {"epoch": f"{event.epoch + 1}/{event.total_epochs}"}
                if self._loss is not None:
                    postfix["loss"] = f"{self._loss:.4f}"
                self._bar.set_postfix(postfix, refresh=False)
                self._bar.refresh()
        elif isinstance(event, Metrics):
            self._loss = event.smooth_loss
        elif isinstance(event, SampleReady):
            self._write(f"sample {event.index} ({event.prompt!r}): {event.path}")
        elif isinstance(event, Status):
            self._write(event.text)
        elif isinstance(event, Warning_):
            self._write(f"warning: {event.text}")
        elif isinstance(event, Finished):
            self._close_bar()
            where = f": {event.output_path}" if event.output_path else ""
            self._write(f"Finished ({event.reason}){where}")
        elif isinstance(event, Failed):
            self._close_bar()

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
