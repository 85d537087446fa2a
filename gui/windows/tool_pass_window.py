"""The tools tab's mask and caption windows: settings, Start / Cancel, a progress bar with count and ETA.

The pass runs on a worker thread (`onetrainer.tools.folder_pass.PassThread`); this window only polls its events with
`after`, so the Tk loop never waits on a model. Closing the window cancels a running pass.
"""

from __future__ import annotations

import gc
import tkinter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

import customtkinter as ctk

from gui.widgets.path_entry import PathEntry, in_window_terms
from gui.window_position import place_over
from onetrainer.tools.downloads import DownloadProgress
from onetrainer.tools.folder_pass import (
    ImageDone,
    ImageSkipped,
    PassFailed,
    PassFinished,
    PassStarted,
    PassStatus,
    PassThread,
    folder_images,
)

if TYPE_CHECKING:
    from gui.dialogs import Dialogs

POLL_MS = 100
ERROR_TEXT = ("#b00020", "#ff6b6b")
MUTED_TEXT = ("gray40", "gray60")


def describe_download(event: DownloadProgress) -> str:
    """ "downloading model.safetensors: 120 / 850 MB — 0:42 left" (files for a repo's file count)."""
    if event.unit == "B":
        scale = 1024**2
        done = f"{event.done / scale:.0f}"
        amount = f"{done} / {event.total / scale:.0f} MB" if event.total else f"{done} MB"
    else:
        amount = f"{event.done} / {event.total} files" if event.total else f"{event.done} files"
    eta = format_eta(event.eta_seconds)
    return f"downloading {event.what}: {amount}" + (f" — {eta} left" if eta else "")


def format_eta(seconds: float | None) -> str:
    if seconds is None:
        return ""
    seconds = round(seconds)
    minutes, seconds = divmod(seconds, 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{seconds:02d}" if hours else f"{minutes}:{seconds:02d}"


class FolderPassWindow(ctk.CTkToplevel):
    """A form of rows (label + widget), then the folder pass controls. Subclasses add rows and `make_task`."""

    title_text = ""
    # The tools' messages are written for the scripts (`--model-path`): the options as this window names them, and
    # whole phrases that read better reworded.
    option_fields: ClassVar[dict[str, str]] = {}
    option_phrases: ClassVar[dict[str, str]] = {}

    def __init__(self, master: Any, dialogs: Dialogs | None = None, folder: str | None = None) -> None:
        super().__init__(master)
        self.title(self.title_text)
        self.dialogs = dialogs
        self.runner = PassThread()
        self.outcome: PassFinished | PassFailed | None = None
        self._polling = False
        self.grid_columnconfigure(1, weight=1)
        self._row = 0
        self.folder = self.entry_row("Folder", folder or "", browse=True)
        self.subfolders = ctk.CTkCheckBox(self, text="Include subfolders")
        self._place(None, self.subfolders)
        self.build_form()
        self._build_controls()
        self.protocol("WM_DELETE_WINDOW", self.close)
        place_over(self, master)

    # -- form rows ------------------------------------------------------------------------------------------------

    def _place(self, label: str | None, widget: Any) -> None:
        if label:
            ctk.CTkLabel(self, text=label, anchor="w").grid(row=self._row, column=0, sticky="w", padx=(12, 6), pady=3)
        widget.grid(row=self._row, column=1, sticky="ew", padx=(0, 12), pady=3)
        self._row += 1

    def entry_row(self, label: str, value: str = "", browse: bool = False) -> ctk.CTkEntry:
        if not browse:
            entry = ctk.CTkEntry(self, width=320)
            entry.insert(0, value)
            self._place(label, entry)
            return entry
        frame = ctk.CTkFrame(self, fg_color="transparent")
        frame.grid_columnconfigure(0, weight=1)
        entry = ctk.CTkEntry(frame, width=320)
        entry.insert(0, value)
        entry.grid(row=0, column=0, sticky="ew")
        ctk.CTkButton(frame, text="…", width=30, command=lambda: self._browse(entry)).grid(row=0, column=1, padx=(4, 0))
        self._place(label, frame)
        return entry

    def path_row(self, label: str, title: str, kinds: tuple[str, ...] = ("file", "folder")) -> ctk.CTkEntry:
        """A path with File… / Folder… buttons (a model file or folder)."""
        field = PathEntry(self, self.dialogs, title, kinds, width=320)
        self._place(label, field)
        return field.entry

    def in_window_terms(self, text: str) -> str:
        return in_window_terms(text, self.option_fields, self.option_phrases)

    def menu_row(self, label: str, values: list[str], value: str, command: Callable | None = None) -> ctk.CTkOptionMenu:
        menu = ctk.CTkOptionMenu(self, values=values, command=command)
        menu.set(value)
        self._place(label, menu)
        return menu

    def _browse(self, entry: ctk.CTkEntry) -> None:
        if self.dialogs is None:
            return
        chosen = self.dialogs.open_dir("Choose the image folder")
        if chosen:
            entry.delete(0, "end")
            entry.insert(0, chosen)

    def build_form(self) -> None:
        raise NotImplementedError

    def make_task(self) -> Callable[[], Any]:
        """A function that builds the task on the worker thread (raise ValueError here for bad settings)."""
        raise NotImplementedError

    # -- running --------------------------------------------------------------------------------------------------

    def _build_controls(self) -> None:
        buttons = ctk.CTkFrame(self, fg_color="transparent")
        buttons.grid(row=self._row, column=0, columnspan=2, sticky="ew", padx=12, pady=(10, 4))
        self.start_button = ctk.CTkButton(buttons, text="Start", width=120, command=self.start)
        self.start_button.pack(side="left")
        self.cancel_button = ctk.CTkButton(buttons, text="Cancel", width=120, command=self.cancel, state="disabled")
        self.cancel_button.pack(side="left", padx=8)
        self.progress = ctk.CTkProgressBar(self)
        self.progress.set(0)
        self.progress.grid(row=self._row + 1, column=0, columnspan=2, sticky="ew", padx=12, pady=4)
        self.status = ctk.CTkLabel(self, text="", anchor="w", justify="left", wraplength=480)
        self._text_color = self.status.cget("text_color")
        self.status.grid(row=self._row + 2, column=0, columnspan=2, sticky="ew", padx=12, pady=(0, 4))
        self.log = ctk.CTkTextbox(self, height=90)
        self.log.grid(row=self._row + 3, column=0, columnspan=2, sticky="nsew", padx=12, pady=(0, 12))
        self.grid_rowconfigure(self._row + 3, weight=1)

    def _show(self, text: str, error: bool = False) -> None:
        self.status.configure(text=text, text_color=ERROR_TEXT if error else self._text_color)

    def start(self) -> bool:
        if self.runner.is_alive():
            return False
        try:
            images = folder_images(self.folder.get().strip(), bool(self.subfolders.get()))
            make_task = self.make_task()
        except (ValueError, FileNotFoundError) as e:
            self._show(self.in_window_terms(str(e)), error=True)
            return False
        if not images:
            self._show("the folder has no images", error=True)
            return False
        self.outcome = None
        self.log.delete("1.0", "end")
        self.progress.set(0)
        self._show(f"starting: {len(images)} images")
        gc.collect()  # Tcl objects of destroyed widgets are freed here, on the Tk thread, not in the worker
        self.runner.start(make_task, images)
        self.start_button.configure(state="disabled")
        self.cancel_button.configure(state="normal")
        if not self._polling:
            self._polling = True
            self.after(POLL_MS, self._poll)
        return True

    def cancel(self) -> None:
        self.runner.cancel()
        self._show("cancelling after the current image (or download chunk)…")

    def close(self) -> None:
        self.runner.cancel()
        self.destroy()

    def _poll(self) -> None:
        try:
            if not self.winfo_exists():
                return
        except tkinter.TclError:
            return
        for event in self.runner.drain():
            self.handle(event)
        if self.runner.is_alive():
            self.after(POLL_MS, self._poll)
            return
        for event in self.runner.drain():  # what the worker emitted just before it ended
            self.handle(event)
        if self.outcome is None and self.runner.outcome is not None:
            self.handle(self.runner.outcome)
        self._polling = False
        self.start_button.configure(state="normal")
        self.cancel_button.configure(state="disabled")

    def handle(self, event: Any) -> None:
        if isinstance(event, PassStarted):
            kept = f", {event.kept} kept (they have one already)" if event.kept else ""
            self._show(f"{event.what}: {event.total} images{kept}")
        elif isinstance(event, PassStatus):
            self._show(event.text)
        elif isinstance(event, DownloadProgress):
            self.progress.set(event.done / event.total if event.total else 0)
            self._show(describe_download(event))
        elif isinstance(event, ImageDone | ImageSkipped):
            self.progress.set(event.done / max(event.total, 1))
            eta = format_eta(event.eta_seconds) if isinstance(event, ImageDone) else ""
            self._show(f"{event.done} / {event.total}" + (f" — {eta} left" if eta else ""))
            if isinstance(event, ImageSkipped):
                self.log.insert("end", f"skipped {event.path}: {event.reason}\n")
        elif isinstance(event, PassFinished):
            self.outcome = event
            head = "cancelled" if event.cancelled else "done"
            self._show(f"{head}: {len(event.written)} written, {len(event.kept)} kept, {len(event.skipped)} skipped")
        elif isinstance(event, PassFailed):
            self.outcome = event
            self._show(self.in_window_terms(event.message), error=True)


def _number(entry: ctk.CTkEntry, name: str, cast: type = float) -> Any:
    text = entry.get().strip()
    try:
        return cast(text)
    except ValueError:
        raise ValueError(f"{name}: '{text}' is not a {'whole ' if cast is int else ''}number") from None


MODEL_PATH_FIELD = "the Model path field"
MODEL_PATH_PHRASES = {
    # u2net's download failed: the file can be downloaded by hand and chosen here.
    "pass the file with --model-path": f"choose the file with the File… button of {MODEL_PATH_FIELD}",
    "(--model-path takes a .onnx file)": "(Model path takes a .onnx file)",
    "--model-path for ": "Model path for ",
}


class MaskWindow(FolderPassWindow):
    title_text = "Generate masks"
    option_fields: ClassVar[dict[str, str]] = {
        "--model-path": MODEL_PATH_FIELD,
        "--add-prompt": "Prompts",
        "--threshold": "Threshold",
    }
    option_phrases: ClassVar[dict[str, str]] = MODEL_PATH_PHRASES

    def build_form(self) -> None:
        from onetrainer.tools.masks import MASK_MODELS, MASK_MODES

        self.model = self.menu_row("Model", list(MASK_MODELS), "CLIPSEG")
        self.prompts = self.entry_row("Prompts (; between)", "")
        self.mode = self.menu_row("Mode", list(MASK_MODES), "fill")
        self.threshold = self.entry_row("Threshold", "0.3")
        self.smooth = self.entry_row("Smooth pixels", "5")
        self.expand = self.entry_row("Expand pixels", "10")
        self.alpha = self.entry_row("Alpha", "1")
        self.model_path = self.path_row("Model path (optional)", "Choose the model (u2net: a .onnx file)")
        self.device = self.entry_row("Device", "")
        hint = "COLOR: the prompt is the backdrop's hex colour (#00ff00). Empty device: CUDA when there is one."
        ctk.CTkLabel(self, text=hint, text_color=MUTED_TEXT, anchor="w").grid(
            row=self._row, column=0, columnspan=2, sticky="w", padx=12
        )
        self._row += 1

    def make_task(self) -> Callable[[], Any]:
        from onetrainer.tools.masks import MaskSettings, MaskTask, create_masker

        settings = MaskSettings(
            self.mode.get(),
            _number(self.alpha, "Alpha"),
            _number(self.threshold, "Threshold"),
            _number(self.smooth, "Smooth pixels", int),
            _number(self.expand, "Expand pixels", int),
        )
        settings.check()
        model, path, device = self.model.get(), self.model_path.get().strip() or None, self.device.get().strip()
        prompts = [p.strip() for p in self.prompts.get().split(";") if p.strip()]
        if model in ("CLIPSEG", "COLOR") and not prompts:
            raise ValueError(f"{model} needs a prompt")
        if model == "COLOR":
            from onetrainer.tools.masks import parse_color

            parse_color(prompts[0])  # a bad colour is named now, not on the worker
        return lambda: MaskTask(create_masker(model, prompts, path, device or None), settings)


class CaptionWindow(FolderPassWindow):
    title_text = "Generate captions"
    option_fields: ClassVar[dict[str, str]] = {
        "--model-path": MODEL_PATH_FIELD,
        "--initial-caption": "Initial caption",
        "--caption-prefix": "Caption prefix",
        "--caption-postfix": "Caption postfix",
    }
    option_phrases: ClassVar[dict[str, str]] = MODEL_PATH_PHRASES

    def build_form(self) -> None:
        from onetrainer.tools.captions import CAPTION_MODELS, CAPTION_MODES

        self.model = self.menu_row("Model", list(CAPTION_MODELS), "BLIP")
        self.initial = self.entry_row("Initial caption", "")
        self.prefix = self.entry_row("Caption prefix", "")
        self.postfix = self.entry_row("Caption postfix", "")
        self.mode = self.menu_row("Mode", list(CAPTION_MODES), "fill")
        self.model_path = self.path_row("Model path (optional)", "Choose the model (a folder, or WD14's .onnx file)")
        self.device = self.entry_row("Device", "")

    def make_task(self) -> Callable[[], Any]:
        from onetrainer.tools.captions import CAPTION_MODES, CaptionTask, create_captioner

        model, path, device = self.model.get(), self.model_path.get().strip() or None, self.device.get().strip()
        mode, initial, prefix, postfix = self.mode.get(), self.initial.get(), self.prefix.get(), self.postfix.get()
        if mode not in CAPTION_MODES:
            raise ValueError(f"unknown mode {mode}")
        if initial and model in ("WD14_VIT_2", "FLORENCE_2"):
            raise ValueError(f"{model} takes no initial caption (BLIP and BLIP2 do)")
        return lambda: CaptionTask(create_captioner(model, path, device or None), mode, initial, prefix, postfix)
