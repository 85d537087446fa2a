"""The tools tab's LoRA toolbox: merge a LoRA into its model, extract one from a fine-tune, resize, merge several,
average checkpoints (EMA) — the jobs of `scripts/lora_tool.py` (`onetrainer.tools.lora_jobs`), on a worker thread.

The window shows the fields the chosen command reads, a progress bar with what is being done, the per-layer report,
and Cancel, which stops the job at its next layer or file with nothing written. Closing the window cancels too.
Opened from the app, it starts from the current config (its model type, base model, transformer file, and what it
trains once a run has written it), as the sampling window does; it keeps its width whichever command is shown.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import tkinter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import customtkinter as ctk

from gui.dialogs import MODEL_FILES
from gui.widgets.model_type_menu import ModelTypeMenu, trained_output
from gui.widgets.path_entry import PathEntry, in_window_terms
from gui.window_position import place_over
from onetrainer.config import ModelFormat, TrainConfig, TrainingMethod
from onetrainer.config.enums import DataType
from onetrainer.config.model_types import model_type_info
from onetrainer.tools.convert import OUTPUT_DTYPES
from onetrainer.tools.lora_extract import holds_transformer_alone
from onetrainer.tools.lora_jobs import JobCancelled, LoraJob

if TYPE_CHECKING:
    from gui.dialogs import Dialogs

POLL_MS = 60
ERROR_TEXT = ("#b00020", "#ff6b6b")
OVERWRITE_TEXT = "Replace an existing destination"
INPUT_DTYPE = "as the input"
# What the menu says → the command.
COMMAND_LABELS = {
    "Merge a LoRA into its model": "merge",
    "Extract a LoRA from a fine-tune": "extract",
    "Resize a LoRA (lower rank)": "resize",
    "Merge LoRAs into one": "merge-loras",
    "Average checkpoints (post-hoc EMA)": "ema",
}
# The fields each command reads (the others are hidden; "transformer" only for a family whose single files hold the
# transformer alone).
FIELDS = {
    "merge": ("model_type", "base_model", "transformer", "loras", "strengths", "output_format", "output_dtype"),
    "extract": (
        "model_type",
        "base_model",
        "transformer",
        "input_name",
        "rank",
        "energy",
        "output_format",
        "output_dtype",
    ),
    "resize": ("loras", "rank", "energy", "output_dtype"),
    "merge-loras": ("loras", "strengths", "rank", "output_dtype"),
    "ema": ("loras", "decay", "sigma_rel", "output_dtype"),
}
# The jobs' messages are written for the script: its options as this window names them.
OPTION_FIELDS = {
    "--lora": "LoRA files",
    "--strength": "Strengths",
    "--model-type": "Model type",
    "--base-model-name": "Base model",
    "--input-name": "Fine-tuned model",
    "--transformer-model-name": "Transformer model",
    "--output-model-format": "Output format",
    "--rank": "Rank",
    "--energy": "Energy",
    "--decay": "Decay",
    "--sigma-rel": "Sigma rel",
    "--output-model-destination": "Destination",
    "--output-dtype": "Output data type",
}
OPTION_PHRASES = {
    "add --overwrite to replace it": f"tick '{OVERWRITE_TEXT}' to replace it",
    "takes one --lora": "takes one LoRA file",
}


class LoraToolWindow(ctk.CTkToplevel):
    def __init__(self, master: Any, dialogs: Dialogs | None = None, config: TrainConfig | None = None) -> None:
        super().__init__(master)
        self.title("LoRA tools")
        self.dialogs = dialogs
        self.grid_columnconfigure(1, weight=1)
        self._row = 0
        self._rows: dict[str, list[Any]] = {}
        self.command = self._menu("command", "Command", list(COMMAND_LABELS), next(iter(COMMAND_LABELS)))
        self.model_type = ModelTypeMenu(self, on_change=lambda _type: self._command_changed())
        self._place("model_type", self._label("model_type", "Model type"), self.model_type)
        self.base_model = self._path("base_model", "Base model", ("file", "folder"))
        self.transformer = self._path("transformer", "Transformer model\n(optional: a file)", ("file",))
        self.input_name = self._path("input_name", "Fine-tuned model", ("file", "folder"))
        self.loras = self._lora_list()
        self.strengths = self._entry("strengths", "Strengths (one per LoRA)", "1.0")
        self.rank = self._entry("rank", "Rank", "")
        self.energy = self._entry("energy", "Energy (share kept, or rank)", "")
        self.decay = self._entry("decay", "Decay", "")
        self.sigma_rel = self._entry("sigma_rel", "Sigma rel (or decay)", "")
        self.output_format = self._menu("output_format", "Output format", [], ModelFormat.DIFFUSERS.value)
        dtypes = [INPUT_DTYPE, *(d.value for d in OUTPUT_DTYPES)]
        self.output_dtype = self._menu("output_dtype", "Output data type", dtypes, INPUT_DTYPE)
        self.destination = self._path("destination", "Destination", ("save",))
        self.overwrite = ctk.CTkCheckBox(self, text=OVERWRITE_TEXT)
        self.overwrite.grid(row=self._row, column=1, sticky="w", padx=(0, 12), pady=3)
        self._row += 1

        buttons = ctk.CTkFrame(self, fg_color="transparent")
        buttons.grid(row=self._row, column=0, columnspan=2, sticky="w", padx=12, pady=(10, 4))
        self.run_button = ctk.CTkButton(buttons, text="Run", width=110, command=self.start)
        self.run_button.pack(side="left", padx=(0, 6))
        self.cancel_button = ctk.CTkButton(buttons, text="Cancel", width=110, command=self.cancel, state="disabled")
        self.cancel_button.pack(side="left")
        self.progress = ctk.CTkProgressBar(self)
        self.progress.set(0)
        self.progress.grid(row=self._row + 1, column=0, columnspan=2, sticky="ew", padx=12, pady=(4, 2))
        self.status = ctk.CTkLabel(self, text="", anchor="w", justify="left", wraplength=560)
        self.status.grid(row=self._row + 2, column=0, columnspan=2, sticky="ew", padx=12, pady=(0, 4))
        self._text_color = self.status.cget("text_color")
        self.report = ctk.CTkTextbox(self, height=120, wrap="none")
        self.report.grid(row=self._row + 3, column=0, columnspan=2, sticky="nsew", padx=12, pady=(0, 12))
        self.grid_rowconfigure(self._row + 3, weight=1)

        self._thread: threading.Thread | None = None
        self._events: queue.Queue = queue.Queue()
        self._cancel = threading.Event()
        self.outcome: str = ""  # "done", "cancelled" or "failed" once a job has ended
        self.written: list[Path] = []
        self.command.configure(command=lambda _v: self._command_changed())
        self.protocol("WM_DELETE_WINDOW", self.close)
        self._fix_width()
        if config is not None:
            self.take_config(config)
        self._command_changed()
        place_over(self, master)

    def take_config(self, config: TrainConfig) -> None:
        """Start from the main window's config: its model type, base model and transformer file, and what it trains
        once written (a LoRA for the LoRA commands, a fine-tune as the model to extract from)."""
        self.model_type.set_model_type(config.model_type)
        _set(self.base_model, config.base_model_name)
        _set(self.transformer, config.transformer.model_name)
        trained = trained_output(config)
        if trained and config.training_method is TrainingMethod.LORA:
            self.set_loras([trained])
        elif trained and config.training_method is TrainingMethod.FINE_TUNE:
            _set(self.input_name, trained)
        self._command_changed()

    def _fix_width(self) -> None:
        """Each column as wide as its widest field of any command, so the window keeps its width whichever command
        and model type are shown; the status wraps within it."""
        self.update_idletasks()
        labels = max(widgets[0].winfo_reqwidth() for widgets in self._rows.values()) + 18  # padx (12, 6)
        fields = max(widgets[1].winfo_reqwidth() for widgets in self._rows.values()) + 12  # padx (0, 12)
        self.grid_columnconfigure(0, minsize=labels)
        self.grid_columnconfigure(1, minsize=fields)
        scaling = self.status._get_widget_scaling()  # wraplength is given unscaled; the widths are pixels
        self.status.configure(wraplength=(labels + fields - 24) / scaling)  # its padx (12, 12)

    # -- the form ----------------------------------------------------------------------------------------------------

    def _label(self, key: str, text: str) -> ctk.CTkLabel:
        label = ctk.CTkLabel(self, text=text, anchor="w")
        label.grid(row=self._row, column=0, sticky="nw", padx=(12, 6), pady=3)
        return label

    def _place(self, key: str, label: ctk.CTkLabel, widget: Any) -> None:
        widget.grid(row=self._row, column=1, sticky="ew", padx=(0, 12), pady=3)
        self._rows[key] = [label, widget]
        self._row += 1

    def _menu(self, key: str, text: str, values: list[str], value: str) -> ctk.CTkOptionMenu:
        label = self._label(key, text)
        # Not resized to its text (sticky "ew" stretches it): another command's formats never widen the window.
        menu = ctk.CTkOptionMenu(self, values=values or [value], dynamic_resizing=False)
        menu.set(value)
        self._place(key, label, menu)
        return menu

    def _entry(self, key: str, text: str, value: str) -> ctk.CTkEntry:
        label = self._label(key, text)
        entry = ctk.CTkEntry(self, width=160)
        if value:
            entry.insert(0, value)
        self._place(key, label, entry)
        return entry

    def _path(self, key: str, text: str, kinds: tuple[str, ...]) -> ctk.CTkEntry:
        label = self._label(key, text)
        field = PathEntry(self, self.dialogs, text, kinds, filetypes=MODEL_FILES, default_ext=".safetensors")
        self._place(key, label, field)
        return field.entry

    def _lora_list(self) -> ctk.CTkTextbox:
        label = self._label("loras", "LoRA files (one per line;\nema: or a save folder)")
        frame = ctk.CTkFrame(self, fg_color="transparent")
        frame.grid_columnconfigure(0, weight=1)
        box = ctk.CTkTextbox(frame, height=70, wrap="none")
        box.grid(row=0, column=0, sticky="ew")
        add = ctk.CTkButton(frame, text="Add…", width=78, command=self._add_lora)
        add.grid(row=0, column=1, sticky="n", padx=(4, 0))
        self._place("loras", label, frame)
        return box

    def _add_lora(self) -> str:
        if self.dialogs is None:
            return ""
        chosen = self.dialogs.open_file("LoRA file", MODEL_FILES)
        if chosen:
            self.add_lora(chosen)
        return chosen

    def add_lora(self, path: str) -> None:
        self.set_loras([*self.lora_names(), path])

    def lora_names(self) -> list[str]:
        return [line.strip() for line in self.loras.get("1.0", "end").splitlines() if line.strip()]

    def set_loras(self, paths: list[str]) -> None:
        self.loras.delete("1.0", "end")
        self.loras.insert("1.0", "\n".join(paths))

    @property
    def chosen_command(self) -> str:
        return COMMAND_LABELS[self.command.get()]

    def choose(self, command: str) -> None:
        """Show the form of `command` ("merge", "extract", "resize", "merge-loras", "ema")."""
        self.command.set(next(label for label, c in COMMAND_LABELS.items() if c == command))
        self._command_changed()

    def shown_fields(self) -> list[str]:
        return [key for key, widgets in self._rows.items() if widgets[1].winfo_manager()]

    def _command_changed(self) -> None:
        shown = {"command", "destination", *FIELDS[self.chosen_command]}
        if not holds_transformer_alone(self.model_type.model_type):
            shown.discard("transformer")
        for key, widgets in self._rows.items():
            for widget in widgets:
                if key in shown:
                    widget.grid()
                else:
                    widget.grid_remove()
        self._update_formats()

    def _update_formats(self) -> None:
        command = self.chosen_command
        if command == "merge":
            info = model_type_info(self.model_type.model_type)
            formats = [f.value for f in info.family.output_formats.get(TrainingMethod.FINE_TUNE, ())]
        else:
            formats = [ModelFormat.KOHYA_LORA.value, ModelFormat.DIFFUSERS_LORA.value]
        self.output_format.configure(values=formats)
        if self.output_format.get() not in formats:
            self.output_format.set(formats[0])

    # -- the job -----------------------------------------------------------------------------------------------------

    def job(self) -> LoraJob:
        """The job the form describes; raises ValueError naming a field whose text is not a number."""
        fields = set(self.shown_fields())
        loras = self.lora_names()
        dtype = self.output_dtype.get()
        return LoraJob(
            command=self.chosen_command,
            destination=Path(self.destination.get().strip()),
            loras=loras if "loras" in fields else [],
            strengths=_numbers(self.strengths, "Strengths", float) if "strengths" in fields else [],
            rank=_number(self.rank, "Rank", int) if "rank" in fields else None,
            energy=_number(self.energy, "Energy", float) if "energy" in fields else None,
            decay=_number(self.decay, "Decay", float) if "decay" in fields else None,
            sigma_rel=_number(self.sigma_rel, "Sigma rel", float) if "sigma_rel" in fields else None,
            model_type=self.model_type.model_type if "model_type" in fields else None,
            base_model_name=self.base_model.get().strip() if "base_model" in fields else "",
            input_name=self.input_name.get().strip() if "input_name" in fields else "",
            transformer_model_name=self.transformer.get().strip() if "transformer" in fields else "",
            output_format=ModelFormat(self.output_format.get()) if "output_format" in fields else None,
            output_dtype=None if dtype == INPUT_DTYPE else DataType(dtype),
            overwrite=bool(self.overwrite.get()),
        )

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> bool:
        """Check the form and start the job on a worker thread; False (and the problems shown) when it cannot."""
        if self.running:
            return False
        if not self.destination.get().strip():
            self._show("choose the destination", error=True)
            return False
        try:
            job = self.job()
        except ValueError as e:
            self._show(str(e), error=True)
            return False
        problems = job.problems()
        if problems:
            self._show("\n".join(in_window_terms(p, OPTION_FIELDS, OPTION_PHRASES) for p in problems), error=True)
            return False
        self._cancel.clear()
        self.outcome, self.written = "", []
        self.report.delete("1.0", "end")
        self.progress.set(0)
        self._show(f"{self.command.get()}…")
        self.run_button.configure(state="disabled")
        self.cancel_button.configure(state="normal")
        self._thread = threading.Thread(target=self._work, args=(job,), name="onetrainer-lora-tool", daemon=True)
        self._thread.start()
        self.after(POLL_MS, self._poll)
        return True

    def cancel(self) -> None:
        if self.running:
            self._cancel.set()
            self.cancel_button.configure(state="disabled")
            self._show("cancelling at the next layer…")

    def close(self) -> None:
        self.cancel()
        self.destroy()

    def _work(self, job: LoraJob) -> None:
        """The worker thread: the job, its reports and progress put on the queue for the Tk thread."""

        def progress(what: str, done: int, total: int) -> None:
            if self._cancel.is_set():
                raise JobCancelled
            self._events.put(("progress", (what, done, total)))

        try:
            # The model loads of merge and extract take the model-library lock themselves.
            written = job.run(lambda text: self._events.put(("log", text)), progress)
        except JobCancelled:
            self._events.put(("cancelled", None))
        except Exception as e:  # shown in the window; the app goes on
            self._events.put(("failed", in_window_terms(str(e), OPTION_FIELDS, OPTION_PHRASES)))
        else:
            self._events.put(("done", written))

    def _poll(self) -> None:
        try:
            while True:
                kind, value = self._events.get_nowait()
                self._handle(kind, value)
        except queue.Empty:
            pass
        except tkinter.TclError:  # the window is gone
            return
        if self.outcome:
            return
        with contextlib.suppress(tkinter.TclError):  # closed meanwhile
            self.after(POLL_MS, self._poll)

    def _handle(self, kind: str, value: Any) -> None:
        if kind == "progress":
            what, done, total = value
            if total:
                self.progress.set(done / total)
                self._show(f"{what}: {done} / {total}")
            else:
                self._show(f"{what}…")
        elif kind == "log":
            self.report.insert("end", value + "\n")
            self.report.see("end")
        elif kind == "done":
            self.written = list(value)
            self.progress.set(1)
            self._finish("done", "written: " + ", ".join(str(p) for p in self.written))
        elif kind == "cancelled":
            self._finish("cancelled", "cancelled: nothing was written")
        elif kind == "failed":
            self._finish("failed", value, error=True)

    def _finish(self, outcome: str, text: str, error: bool = False) -> None:
        self.outcome = outcome
        self.run_button.configure(state="normal")
        self.cancel_button.configure(state="disabled")
        self._show(text, error)

    def _show(self, text: str, error: bool = False) -> None:
        self.status.configure(text=text, text_color=ERROR_TEXT if error else self._text_color)

    @property
    def status_text(self) -> str:
        return self.status.cget("text")


def _set(entry: ctk.CTkEntry, text: str) -> None:
    entry.delete(0, "end")
    entry.insert(0, text)


def _number(entry: ctk.CTkEntry, name: str, kind: type) -> Any:
    text = entry.get().strip()
    if not text:
        return None
    try:
        return kind(text)
    except ValueError:
        raise ValueError(f"{name}: '{text}' is not a {'whole ' if kind is int else ''}number") from None


def _numbers(entry: ctk.CTkEntry, name: str, kind: type) -> list:
    text = entry.get().replace(";", ",").strip()
    parts = [p.strip() for p in text.split(",") if p.strip()]
    try:
        return [kind(p) for p in parts]
    except ValueError:
        raise ValueError(f"{name}: '{text}' is not a list of numbers (1.0, 0.5)") from None
