"""The footer: progress of the run (epoch and step bars, it/s, ETA, loss), a status line, the run's warnings, and the
run's buttons.

The status line has a row of its own and always one line: a text longer than the window is wide (or of several lines)
is shortened with "…", and its whole text is the line's tooltip, so the footer keeps its height whatever it says and the
progress row above never moves. Warnings of the run (the CPU fallback) stay shown beside the buttons, shortened the same
way: the next status line does not wipe them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import customtkinter as ctk

from gui.widgets.tooltip import Tooltip
from onetrainer.training.events import (
    BestCheckpoint,
    CacheProgress,
    Event,
    Failed,
    Finished,
    Metrics,
    Progress,
    SampleReady,
    Started,
    Status,
    Validated,
    Warning_,
)

STATUS_COLORS = {
    "info": ("gray10", "#DCE4EE"),
    "warning": ("#9a6700", "#e3b341"),
    "error": ("#b03a2e", "#ff7b72"),
    "ok": ("#1a7f37", "#56d364"),
}
STOP_COLOR = ("#b03a2e", "#a8322a")
STOP_HOVER = ("#8e2c23", "#8a2822")


def format_duration(seconds: float | None) -> str:
    """`3725` → `1:02:05`, `65` → `1:05`; an unknown duration is `–`."""
    if seconds is None or seconds != seconds or seconds < 0:
        return "–"
    total = round(seconds)
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def one_line(text: str, width: int, measure: Callable[[str], int], suffix: str = "") -> str:
    """`text` as one line of at most `width` pixels (`measure` gives a text's width): its first line, cut with "…"
    where it is too long or more lines follow; `suffix` ("(+2 more, see Log)") is always shown whole."""
    lines = text.strip().splitlines() or [""]
    first = lines[0].rstrip()
    cut = len(lines) > 1
    if not cut and measure(first + suffix) <= width:
        return first + suffix
    if measure(first + " …" + suffix) <= width:
        return first + " …" + suffix
    low, high = 0, len(first)  # the longest start of the line that fits with the ellipsis (binary search)
    while low < high:
        middle = (low + high + 1) // 2
        if measure(first[:middle].rstrip() + "…" + suffix) <= width:
            low = middle
        else:
            high = middle - 1
    return first[:low].rstrip() + "…" + suffix


def format_speed(per_second: float, unit: str = "it") -> str:
    if per_second <= 0:
        return f"– {unit}/s"
    if per_second < 1:
        return f"{1 / per_second:.2f} s/{unit}"
    return f"{per_second:.2f} {unit}/s"


class Footer(ctk.CTkFrame):
    def __init__(
        self,
        master: Any,
        *,
        on_start: Callable[[], None],
        on_sample: Callable[[], None],
        on_save: Callable[[], None],
        on_backup: Callable[[], None],
        on_tensorboard: Callable[[], None],
        on_export: Callable[[], None],
        on_log: Callable[[], None] | None = None,
        on_queue_add: Callable[[], None] | None = None,
        on_queue: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(master, corner_radius=0)
        self.grid_columnconfigure(1, weight=1)
        self.grid_columnconfigure(4, weight=1)

        ctk.CTkLabel(self, text="Epoch").grid(row=0, column=0, padx=(10, 6), pady=(8, 2), sticky="w")
        self.epoch_bar = ctk.CTkProgressBar(self)
        self.epoch_bar.grid(row=0, column=1, sticky="ew", pady=(8, 2))
        self.epoch_text = ctk.CTkLabel(self, text="–", width=90, anchor="w")
        self.epoch_text.grid(row=0, column=2, padx=6, pady=(8, 2), sticky="w")
        # "Caching" while the cache fills before training: its bar then counts the images (or captions) encoded.
        self.step_label = ctk.CTkLabel(self, text="Step")
        self.step_label.grid(row=0, column=3, padx=(10, 6), pady=(8, 2), sticky="w")
        self.step_bar = ctk.CTkProgressBar(self)
        self.step_bar.grid(row=0, column=4, sticky="ew", pady=(8, 2))
        self.step_text = ctk.CTkLabel(self, text="–", width=110, anchor="w")
        self.step_text.grid(row=0, column=5, padx=6, pady=(8, 2), sticky="w")

        figures = ctk.CTkFrame(self, fg_color="transparent")
        figures.grid(row=0, column=6, columnspan=2, sticky="e", padx=(6, 10), pady=(8, 2))
        self.speed_label = ctk.CTkLabel(figures, text="– it/s", width=90)
        self.eta_label = ctk.CTkLabel(figures, text="ETA –", width=100)
        self.loss_label = ctk.CTkLabel(figures, text="loss –", width=190, anchor="w")
        for label in (self.speed_label, self.eta_label, self.loss_label):
            label.pack(side="left", padx=4)
        # Shown once the run validates: the latest validation loss and the best saved checkpoint (per range and the
        # lowest loss in its tooltip).
        self.validation_label = ctk.CTkLabel(figures, text="", anchor="w")
        self._validation_detail = ""
        self.validation_tooltip = Tooltip(self.validation_label, lambda: self._validation_detail)
        self.latest_validation: Validated | None = None
        self.best_checkpoint: BestCheckpoint | None = None

        # Both lines never wrap (a second line would make the footer taller and move the progress row): `one_line`
        # shortens them to the room they have, and the tooltip holds the whole text.
        self.status_label = ctk.CTkLabel(self, text="Ready.", anchor="w", justify="left")
        self.status_label.grid(row=1, column=0, columnspan=6, sticky="ew", padx=10, pady=(2, 0))
        # The queue of runs, above Start: how many wait (a click opens the queue window) and Add to queue.
        self.queue_frame = ctk.CTkFrame(self, fg_color="transparent")
        self.queue_frame.grid(row=1, column=6, columnspan=2, sticky="e", padx=(6, 10), pady=(2, 0))
        self.queue_button = ctk.CTkButton(
            self.queue_frame, text="Queue", width=130, command=on_queue or (lambda: None), fg_color="transparent",
            border_width=1, text_color=("gray10", "gray90"),
        )  # fmt: skip
        self.queue_add_button = ctk.CTkButton(
            self.queue_frame, text="Add to queue", width=130, command=on_queue_add or (lambda: None)
        )
        self.queue_button.pack(side="left", padx=3)
        self.queue_add_button.pack(side="left", padx=3)
        self._status_text = "Ready."
        self._status_keep = ""
        self._status_level = "info"
        self.warnings: list[str] = []  # this run's warnings, the newest shown in `notice_label`
        self._notice_text = ""
        self.notice_label = ctk.CTkLabel(self, text="", anchor="w", justify="left", text_color=STATUS_COLORS["warning"])
        self.notice_label.grid(row=2, column=0, columnspan=5, sticky="ew", padx=10, pady=(2, 8))
        self.status_tooltip = Tooltip(self.status_label, lambda: self._whole(self.status_label, self._status_text))
        self.notice_tooltip = Tooltip(self.notice_label, lambda: self._whole(self.notice_label, self._notice_text))

        buttons = ctk.CTkFrame(self, fg_color="transparent")
        self.buttons = buttons
        buttons.grid(row=2, column=5, columnspan=3, sticky="e", padx=(6, 10), pady=(2, 8))
        self.start_button = ctk.CTkButton(buttons, text="Start training", width=130, command=on_start)
        self._start_colors = (self.start_button.cget("fg_color"), self.start_button.cget("hover_color"))
        self.sample_button = ctk.CTkButton(buttons, text="Sample now", width=100, command=on_sample)
        self.save_button = ctk.CTkButton(buttons, text="Save now", width=90, command=on_save)
        self.backup_button = ctk.CTkButton(buttons, text="Backup now", width=100, command=on_backup)
        self.tensorboard_button = ctk.CTkButton(buttons, text="TensorBoard", width=100, command=on_tensorboard)
        self.export_button = ctk.CTkButton(buttons, text="Export config", width=110, command=on_export)
        self.log_button = ctk.CTkButton(buttons, text="Log", width=60, command=on_log or (lambda: None))
        for button in (
            self.log_button,
            self.tensorboard_button,
            self.export_button,
            self.sample_button,
            self.save_button,
            self.backup_button,
            self.start_button,
        ):
            button.pack(side="left", padx=3)

        self.running = False
        self.stopping = False
        self.commands_enabled = False  # Sample / Save / Backup now (see `set_commands`)
        self.caching: CacheProgress | None = None  # the cache pass the step bar shows
        self.last_log_path = ""
        self.totals: tuple[int, int, int] = (0, 0, 0)  # total steps, epochs, steps per epoch
        self.reset_progress()
        self.set_running(False)
        self.bind("<Configure>", self._resized, add="+")

    def _resized(self, _event: Any = None) -> None:
        self._show_status()
        self._show_notice()

    def _room(self, label: ctk.CTkLabel) -> int:
        """The pixels `label` may fill: the footer's width (the window's before it is laid out) less what is beside."""
        width = self.winfo_width()
        if width <= 1:
            width = max(self.winfo_toplevel().winfo_width(), 1000)
        if label is self.notice_label:
            return max(150, width - self.buttons.winfo_reqwidth() - 40)
        cell = self.grid_bbox(0, 1, 5, 1)  # the status line's columns, left of the queue's buttons
        if cell[2] > 1:
            return max(200, cell[2] - 20)
        return max(200, width - self.queue_frame.winfo_reqwidth() - 40)

    def _measure(self, label: ctk.CTkLabel) -> Callable[[str], int]:
        font = label.cget("font")
        scaling = ctk.ScalingTracker.get_widget_scaling(label)
        if isinstance(font, ctk.CTkFont):
            return lambda text: round(font.measure(text) * scaling)
        return lambda text: round(ctk.CTkFont().measure(text) * scaling)  # a plain font tuple: the default's size

    def _whole(self, label: ctk.CTkLabel, text: str) -> str:
        """The tooltip: the whole text where the line shows less of it."""
        return text if label.cget("text") != text.strip() else ""

    def _show_status(self) -> None:
        label = self.status_label
        text = self._status_text.removesuffix(self._status_keep) if self._status_keep else self._status_text
        label.configure(text=one_line(text, self._room(label), self._measure(label), self._status_keep))

    def _show_notice(self) -> None:
        if not self.warnings:
            self.notice_label.configure(text="")
            return
        more = f" (+{len(self.warnings) - 1} more, see Log)" if len(self.warnings) > 1 else ""
        label = self.notice_label
        label.configure(text=one_line(f"⚠ {self.warnings[-1]}", self._room(label), self._measure(label), more))

    # -- state -------------------------------------------------------------------------------------------------

    def set_running(self, running: bool) -> None:
        self.running = running
        self.stopping = False
        fg, hover = (STOP_COLOR, STOP_HOVER) if running else self._start_colors
        self.start_button.configure(
            text="Stop training" if running else "Start training", state="normal", fg_color=fg, hover_color=hover
        )
        self.set_commands(False)  # until the run's steps begin (`set_commands`)

    def set_commands(self, enabled: bool) -> None:
        """Sample / Save / Backup now: the trainer takes them at a step, so they are enabled while steps run (not while
        the model loads or the cache fills, nor once a stop is asked for)."""
        self.commands_enabled = enabled
        for button in (self.sample_button, self.save_button, self.backup_button):
            button.configure(state="normal" if enabled else "disabled")

    def set_stopping(self) -> None:
        self.stopping = True
        self.start_button.configure(text="Stopping…", state="disabled")
        self.set_commands(False)
        if self.caching is not None:
            entry = self.caching.unit.removesuffix("s")
            self.set_status(f"Stopping after the {entry} being cached (what is cached stays for the next run)…")
        else:
            self.set_status("Stopping at the next step…")

    def set_status(self, text: str, level: str = "info", keep: str = "") -> None:
        """Show `text` on the status line, shortened to one line (the whole text is its tooltip and `status`);
        `keep` follows it and is never cut (" (and 2 more; see Log)")."""
        self._status_text = text + keep
        self._status_keep = keep
        self._status_level = level
        self.status_label.configure(text_color=STATUS_COLORS[level])
        self._show_status()

    def set_queue(self, text: str) -> None:
        """What the queue button says: "Queue: 2 waiting", "Queue: running, 1 waiting", "Queue: empty"."""
        self.queue_button.configure(text=text)

    @property
    def queue_text(self) -> str:
        return self.queue_button.cget("text")

    @property
    def status(self) -> str:
        """The whole status text (the line may show it shortened)."""
        return self._status_text

    @property
    def status_shown(self) -> str:
        """What the status line shows."""
        return self.status_label.cget("text")

    @property
    def status_level(self) -> str:
        return self._status_level

    @property
    def validation_text(self) -> str:
        return self.validation_label.cget("text")

    def _show_validation(self) -> None:
        shown, detail = [], []
        latest, best = self.latest_validation, self.best_checkpoint
        if latest is not None:
            shown.append(f"val {latest.loss:.4f}")
            detail.append(f"validation at {latest.label}: {latest.loss:.4f}")
            detail += [f"  {name}: {value:.4f}" for name, value in latest.ranges.items()]
            detail.append(f"lowest so far: {latest.best_loss:.4f} at {latest.best_label}")
        if best is not None:
            shown.append(best.describe())
            detail.append(f"best saved checkpoint: {best.path}")
        self.validation_label.configure(text=" · ".join(shown))
        self._validation_detail = "\n".join(detail)
        if shown and not self.validation_label.winfo_manager():
            self.validation_label.pack(side="left", padx=4)
        elif not shown and self.validation_label.winfo_manager():
            self.validation_label.pack_forget()

    def reset_progress(self) -> None:
        """No run's figures (before a run, and after a preset or config replaced the one that ran)."""
        self.latest_validation = self.best_checkpoint = None
        self._show_validation()
        self.caching = None
        self.step_label.configure(text="Step")
        self.epoch_bar.set(0)
        self.step_bar.set(0)
        self.epoch_text.configure(text="–")
        self.step_text.configure(text="–")
        self._reset_figures(loss=True)
        self.warnings = []
        self._notice_text = ""
        self._show_notice()

    def _reset_figures(self, loss: bool) -> None:
        self.speed_label.configure(text="– it/s")
        self.eta_label.configure(text="ETA –")
        if loss:
            self.loss_label.configure(text="loss –")

    def add_warning(self, text: str) -> None:
        """A warning that stays shown for the rest of the run (the status line moves on)."""
        self.warnings.append(text)
        more = f" (+{len(self.warnings) - 1} more, see Log)" if len(self.warnings) > 1 else ""
        self._notice_text = f"⚠ {text}{more}"
        self._show_notice()

    @property
    def notice(self) -> str:
        """The whole notice (the line may show the warning shortened)."""
        return self._notice_text

    # -- events from the trainer ---------------------------------------------------------------------------------

    def on_event(self, event: Event) -> None:
        if isinstance(event, Started):
            warnings = self.warnings  # those before the start (the device) belong to this run
            self.reset_progress()
            for text in warnings:
                self.add_warning(text)
            self.totals = (event.total_steps, event.total_epochs, event.steps_per_epoch)
            self.last_log_path = event.log_path
            self.epoch_text.configure(text=f"0 / {event.total_epochs}")
            self.step_text.configure(text=f"0 / {event.steps_per_epoch}")
            self.set_status(f"Training started: {event.run_name}")
            self.set_commands(not self.stopping)
        elif isinstance(event, CacheProgress):
            self._caching(event)
        elif isinstance(event, Progress):
            self._progress(event)
        elif isinstance(event, Metrics):
            self.loss_label.configure(text=f"loss {event.loss:.4f}  (smooth {event.smooth_loss:.4f})")
        elif isinstance(event, Validated):
            self.latest_validation = event
            self._show_validation()
        elif isinstance(event, BestCheckpoint):
            self.best_checkpoint = event
            self._show_validation()
        elif isinstance(event, SampleReady):
            # The file's name only: a full path wraps the status line (the sampling tab shows the image).
            self.set_status(f"Sample ready (step {event.global_step}): {Path(event.path).name}")
        elif isinstance(event, Status):
            self.set_status(event.text)
        elif isinstance(event, Warning_):
            self.set_status(f"Warning: {event.text}", "warning")
            self.add_warning(event.text)
        elif isinstance(event, Finished):
            # A speed and time left of a run that no longer runs would be false; a stopped run's loss too.
            self._reset_figures(loss=event.reason != "completed")
            if event.reason == "completed":
                self.epoch_bar.set(1)
                self.step_bar.set(1)
            where = f" → {event.output_path}" if event.output_path else ""
            self.set_status(f"Finished ({event.reason}){where}", "ok")
        elif isinstance(event, Failed):
            self._reset_figures(loss=True)
            first_line = event.message.strip().splitlines()[0] if event.message.strip() else "unknown error"
            self.set_status(f"{event.headline}: {first_line}", "error")
            if event.log_path:
                self.last_log_path = event.log_path

    def _caching(self, event: CacheProgress) -> None:
        self.caching = event
        self.step_label.configure(text="Caching")
        self.step_bar.set(event.done / event.total if event.total else 1.0)
        self.step_text.configure(text=f"{event.done} / {event.total}")
        self.speed_label.configure(text=format_speed(event.per_second, "img" if event.kind == "latents" else "cap"))
        self.eta_label.configure(text=f"ETA {format_duration(event.eta_seconds)}")
        left = f", {format_duration(event.eta_seconds)} left" if event.eta_seconds is not None else ""
        self.set_status(f"Caching {event.kind}: {event.done} of {event.total} {event.unit} encoded{left}")

    def _progress(self, event: Progress) -> None:
        steps_per_epoch = max(1, event.steps_per_epoch)
        epochs = max(1, event.total_epochs)
        self.epoch_bar.set(min(1.0, (event.epoch + event.epoch_step / steps_per_epoch) / epochs))
        self.step_bar.set(min(1.0, event.epoch_step / steps_per_epoch))
        self.epoch_text.configure(text=f"{event.epoch + 1} / {event.total_epochs}")
        self.step_text.configure(text=f"{event.epoch_step} / {event.steps_per_epoch}")
        self.speed_label.configure(text=format_speed(event.steps_per_second))
        self.eta_label.configure(text=f"ETA {format_duration(event.eta_seconds)}")
