"""Automatic masks and captions inside the dataset tool: for the shown image or the whole folder, with undo.

A row of controls is attached below the dataset tool's caption. The work is a folder pass on a worker thread
(`PassThread`), polled with `after`: the shown image is masked or captioned anew (replace) and shown at once, the
folder only gets what it lacks (fill: nothing a user made is overwritten). "Undo" takes back the last automatic
change: the image's previous mask or caption comes back (or the new file goes), and after a folder pass the files
it wrote are removed.
"""

from __future__ import annotations

import contextlib
import gc
import tkinter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import customtkinter as ctk

from gui.windows.tool_pass_window import describe_download
from onetrainer.data.video import is_clip
from onetrainer.tools.downloads import DownloadProgress
from onetrainer.tools.folder_pass import ImageDone, ImageSkipped, PassFailed, PassFinished, PassThread
from onetrainer.util.fs import atomic_write_bytes

if TYPE_CHECKING:
    from gui.windows.dataset_tool import DatasetToolWindow

POLL_MS = 100


class DatasetAutomation:
    def __init__(self, tool: DatasetToolWindow) -> None:
        from onetrainer.tools.captions import CAPTION_MODELS
        from onetrainer.tools.masks import MASK_MODELS

        self.tool = tool
        self.runner = PassThread()
        self.outcome: PassFinished | PassFailed | None = None
        self.undo_action: tuple | None = None
        self._pending: tuple | None = None  # what the running pass changes: ("mask"|"caption", scope, previous)
        frame = ctk.CTkFrame(tool, fg_color="transparent")
        frame.grid(row=5, column=0, columnspan=2, sticky="ew", padx=10, pady=(0, 8))
        self.frame = frame
        ctk.CTkLabel(frame, text="Auto mask").grid(row=0, column=0, sticky="w", padx=(0, 6))
        self.mask_model = ctk.CTkOptionMenu(frame, values=list(MASK_MODELS), width=130)
        self.mask_model.grid(row=0, column=1, padx=2)
        self.mask_prompt = ctk.CTkEntry(frame, width=180, placeholder_text="prompt; prompt (COLOR: #00ff00)")
        self.mask_prompt.grid(row=0, column=2, padx=2)
        self.mask_path = ctk.CTkEntry(frame, width=150, placeholder_text="model path (optional)")
        self.mask_path.grid(row=0, column=3, padx=2)
        self.mask_image_button = ctk.CTkButton(frame, text="This image", width=90, command=lambda: self.mask(False))
        self.mask_image_button.grid(row=0, column=4, padx=2)
        self.mask_folder_button = ctk.CTkButton(frame, text="Folder", width=70, command=lambda: self.mask(True))
        self.mask_folder_button.grid(row=0, column=5, padx=2)
        ctk.CTkLabel(frame, text="Auto caption").grid(row=1, column=0, sticky="w", padx=(0, 6), pady=(4, 0))
        self.caption_model = ctk.CTkOptionMenu(frame, values=list(CAPTION_MODELS), width=130)
        self.caption_model.grid(row=1, column=1, padx=2, pady=(4, 0))
        self.caption_path = ctk.CTkEntry(frame, width=150, placeholder_text="model path (optional)")
        self.caption_path.grid(row=1, column=3, padx=2, pady=(4, 0))
        self.caption_image_button = ctk.CTkButton(
            frame, text="This image", width=90, command=lambda: self.caption(False)
        )
        self.caption_image_button.grid(row=1, column=4, padx=2, pady=(4, 0))
        self.caption_folder_button = ctk.CTkButton(frame, text="Folder", width=70, command=lambda: self.caption(True))
        self.caption_folder_button.grid(row=1, column=5, padx=2, pady=(4, 0))
        self.cancel_button = ctk.CTkButton(frame, text="Cancel", width=70, command=self.runner_cancel, state="disabled")
        self.cancel_button.grid(row=0, column=6, padx=(10, 2))
        self.undo_button = ctk.CTkButton(frame, text="Undo auto", width=90, command=self.undo, state="disabled")
        self.undo_button.grid(row=1, column=6, padx=(10, 2), pady=(4, 0))

    # -- starting -------------------------------------------------------------------------------------------------

    def _current(self) -> Path | None:
        tool = self.tool
        return tool.images[tool.position] if 0 <= tool.position < len(tool.images) else None

    def mask(self, folder: bool) -> bool:
        from onetrainer.tools.masks import MaskSettings, MaskTask, create_masker, parse_color

        model = self.mask_model.get()
        prompts = [p.strip() for p in self.mask_prompt.get().split(";") if p.strip()]
        path = self.mask_path.get().strip() or None
        try:
            if model in ("CLIPSEG", "COLOR") and not prompts:
                raise ValueError(f"{model} needs a prompt")
            if model == "COLOR":
                parse_color(prompts[0])
        except ValueError as e:
            self.tool._show_status(f"Auto mask: {e}")
            return False
        settings = MaskSettings(mode="fill" if folder else "replace")
        return self._start("mask", folder, lambda: MaskTask(create_masker(model, prompts, path), settings))

    def caption(self, folder: bool) -> bool:
        from onetrainer.tools.captions import CaptionTask, create_captioner

        model, path = self.caption_model.get(), self.caption_path.get().strip() or None
        mode = "fill" if folder else "replace"
        return self._start("caption", folder, lambda: CaptionTask(create_captioner(model, path), mode))

    def _start(self, kind: str, folder: bool, make_task) -> bool:
        if self.runner.is_alive():
            return False
        image = self._current()
        if image is None:
            self.tool._show_status("Open a folder of images first.")
            return False
        if not folder and is_clip(image):  # the maskers and captioners read images
            self.tool._show_status(f"Auto {kind} works on images; {image.name} is a clip.")
            return False
        self.tool._keep_caption()  # a caption being typed is saved before anything replaces it
        if folder:
            images, previous = [path for path in self.tool.images if not is_clip(path)], None
        else:
            images = [image]
            if kind == "mask":
                document = self.tool.document
                previous = document.mask.copy() if document is not None and document.mask is not None else None
            else:
                text_file = image.with_suffix(".txt")
                previous = text_file.read_bytes() if text_file.is_file() else None
        self._pending = (kind, "folder" if folder else image, previous)
        self.outcome = None
        gc.collect()  # Tcl objects of destroyed widgets are freed on the Tk thread, not in the worker
        self.runner.start(make_task, images)
        self._set_running(True)
        self.tool.after(POLL_MS, self._poll)
        return True

    def runner_cancel(self) -> None:
        self.runner.cancel()

    def _set_running(self, running: bool) -> None:
        state = "disabled" if running else "normal"
        for button in (
            self.mask_image_button,
            self.mask_folder_button,
            self.caption_image_button,
            self.caption_folder_button,
        ):
            button.configure(state=state)
        self.cancel_button.configure(state="normal" if running else "disabled")
        self.undo_button.configure(state="disabled" if running or self.undo_action is None else "normal")

    # -- following ------------------------------------------------------------------------------------------------

    def _poll(self) -> None:
        try:
            if not self.tool.winfo_exists():
                self.runner.cancel()
                return
        except tkinter.TclError:
            return
        for event in self.runner.drain():
            self._handle(event)
        if self.runner.is_alive():
            self.tool.after(POLL_MS, self._poll)
            return
        for event in self.runner.drain():
            self._handle(event)
        if self.outcome is None:
            self.outcome = self.runner.outcome
        self._finish()

    def _handle(self, event: Any) -> None:
        if isinstance(event, DownloadProgress):
            self.tool._show_status(f"Auto {self._pending[0]}: {describe_download(event)}")
        elif isinstance(event, ImageDone | ImageSkipped):
            note = f" — skipped {Path(event.path).name}: {event.reason}" if isinstance(event, ImageSkipped) else ""
            self.tool._show_status(f"Auto {self._pending[0]}: {event.done} / {event.total}{note}")
        elif isinstance(event, PassFinished | PassFailed):
            self.outcome = event

    def _finish(self) -> None:
        kind, scope, previous = self._pending
        outcome = self.outcome
        message = ""
        if isinstance(outcome, PassFailed):
            message = f"Auto {kind} failed: {outcome.message}"
        elif isinstance(outcome, PassFinished):
            written = [Path(p) for p in outcome.written]
            if scope == "folder":
                self.undo_action = ("folder", kind, written) if written else self.undo_action
                head = "cancelled" if outcome.cancelled else "done"
                message = (
                    f"Auto {kind}s {head}: {len(written)} written, {len(outcome.kept)} kept, "
                    f"{len(outcome.skipped)} skipped"
                )
            elif written:
                self.undo_action = (kind, scope, previous)
                message = f"Auto {kind}: {written[0].name} (Undo auto takes it back)"
            elif outcome.skipped:
                message = f"Auto {kind}: {outcome.skipped[0][1]}"
            self._refresh()
        self.tool._show_status(message)
        self._set_running(False)

    def _refresh(self) -> None:
        """Show the shown image's mask and caption as they are on disk now."""
        tool = self.tool
        if tool.position >= 0:
            tool.loaded_caption = tool.caption_text()  # nothing to keep: the file is newer
            tool.show_image(tool.position)

    # -- undo -----------------------------------------------------------------------------------------------------

    def undo(self) -> bool:
        if self.undo_action is None or self.runner.is_alive():
            return False
        action, self.undo_action = self.undo_action, None
        message = self._undo(action)
        self._refresh()
        self.tool._show_status(message)
        self._set_running(False)
        return True

    def _undo(self, action: tuple) -> str:
        if action[0] == "folder":
            for path in action[2]:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
            return f"Removed the {len(action[2])} automatic {action[1]}s."
        if action[0] == "mask":
            from onetrainer.data.images import mask_path_of

            image, previous = action[1], action[2]
            mask_file = mask_path_of(image)
            if previous is None:
                with contextlib.suppress(FileNotFoundError):
                    mask_file.unlink()
            else:
                from onetrainer.util.fs import atomic_file

                with atomic_file(mask_file) as tmp:
                    previous.save(tmp, format="PNG")
            return f"Mask of {image.name} restored."
        image, previous = action[1], action[2]
        text_file = image.with_suffix(".txt")
        if previous is None:
            with contextlib.suppress(FileNotFoundError):
                text_file.unlink()
        else:
            atomic_write_bytes(text_file, previous)
        return f"Caption of {image.name} restored."


def attach_automation(tool: DatasetToolWindow) -> DatasetAutomation:
    """Add the automatic mask and caption controls to a dataset tool window (once)."""
    existing = getattr(tool, "automation", None)
    if existing is None:
        existing = DatasetAutomation(tool)
        tool.automation = existing
    return existing
