"""A concept's window: its general settings, image and text augmentation with live previews, how its clips are cut
(video model types) beside a clip's preview (its frames, rate and the windows it gives), and its statistics.

Every form is generated from `ConceptConfig`'s declarations at the concept's path (`concepts.2.…`), so typing here
edits the app's config directly. The window closes itself when the concept list is replaced or reordered, since its
paths would then point at another concept.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import customtkinter as ctk

from gui.concept_preview import clip_rule
from gui.forms.form import Form
from gui.forms.selection import FieldInfo, node_fields
from gui.widgets.problem_line import ProblemLine
from gui.widgets.tabview import TabView
from gui.window_position import place_over
from gui.windows.augmentation_preview import CaptionPreview, ClipPreview, ImagePreview, PreviewCursor
from gui.windows.concept_statistics import StatisticsPane
from onetrainer.config import ConceptConfig

if TYPE_CHECKING:
    from gui.dialogs import Dialogs
    from gui.model import ConfigModel

PREVIEW_DELAY_MS = 150
PAGES = (
    ("general", "general"),
    ("image", "image augmentation"),
    ("text", "text augmentation"),
    ("video", "video clips"),
    ("statistics", "statistics"),
)


class ConceptWindow(ctk.CTkToplevel):
    def __init__(self, master: Any, model: ConfigModel, dialogs: Dialogs | None, index: int) -> None:
        super().__init__(master)
        self.model = model
        self.dialogs = dialogs
        self.index = index
        self.base = f"concepts.{index}"
        place_over(self, master, (1100, 720))
        self.minsize(860, 560)
        self.forms: dict[str, Form] = {}
        self.image_preview: ImagePreview | None = None
        self.caption_preview: CaptionPreview | None = None
        self.clip_preview: ClipPreview | None = None
        self.statistics: StatisticsPane | None = None
        self._problems: dict[str, str] = {}
        self._closed = False
        self._pending: dict[str, str] = {}
        # Subscribed before the forms: on a list change this listener closes the window before they look at paths.
        self._unsubscribe = model.subscribe(self._config_changed)
        self.cursor = PreviewCursor(lambda: self.concept)
        self.grid_columnconfigure(0, weight=1)
        self.grid_rowconfigure(0, weight=1)
        self.tabview = TabView(self, command=self._page_selected, fg_color="transparent")
        self.tabview.grid(row=0, column=0, sticky="nsew", padx=8, pady=(0, 4))
        bottom = ctk.CTkFrame(self, fg_color="transparent")
        bottom.grid(row=1, column=0, sticky="ew", padx=12, pady=(0, 10))
        bottom.grid_columnconfigure(0, weight=1)
        self.problem_line = ProblemLine(bottom, model, self.base)
        self.problem_line.label.grid(row=0, column=0, sticky="ew")
        ctk.CTkButton(bottom, text="Close", width=100, command=self.close).grid(row=0, column=1, sticky="e")
        self.protocol("WM_DELETE_WINDOW", self.close)
        self._show_title()
        self.tabview.set_tabs(PAGES)

    @property
    def concept(self) -> ConceptConfig:
        return self.model.config.concepts[self.index]

    def select(self, page: str) -> None:
        self.tabview.select(page)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._unsubscribe()
        for pending in self._pending.values():
            self.after_cancel(pending)
        if self.statistics is not None:
            self.statistics.cancel()
        self.destroy()

    def mark(self, problems: dict[str, str]) -> None:
        self._problems = problems
        for form in self.forms.values():
            form.mark(problems)

    # -- pages, built when first shown ---------------------------------------------------------------------------

    def _page_selected(self, key: str) -> None:
        if key in self.forms or (key == "statistics" and self.statistics is not None):
            return
        page = self.tabview.page(key)
        if key == "general":
            self._form(page, key, node_fields(self.concept, self.base), columns=2).grid(row=0, column=0, sticky="nsew")
        elif key == "image":
            self.image_preview = ImagePreview(page, self.cursor)
            self._form_beside(page, key, self.image_preview.frame)
            self.image_preview.update_preview()
        elif key == "text":
            self.caption_preview = CaptionPreview(page, self.cursor)
            self._form_beside(page, key, self.caption_preview.frame)
            self.caption_preview.update_preview()
        elif key == "video":  # how clips are cut into samples (video model types; image model types skip clips)
            self.clip_preview = ClipPreview(page, self.cursor, lambda: clip_rule(self.model.config))
            self._form_beside(page, key, self.clip_preview.frame)
            self.clip_preview.update_preview()
        else:
            self.statistics = StatisticsPane(page, self.model, self.index)
            self.statistics.frame.grid(row=0, column=0, sticky="nsew", padx=4, pady=4)
            self.statistics.compute()

    def _form(self, parent: Any, key: str, fields: list[FieldInfo], columns: int) -> ctk.CTkScrollableFrame:
        """A scrollable generated form of `fields` (not yet placed in `parent`)."""
        scroll = ctk.CTkScrollableFrame(parent, fg_color="transparent")
        scroll.grid_columnconfigure(0, weight=1)
        form = Form(scroll, self.model, self.dialogs, key, columns=columns, default_group="Concept", fields=fields)
        form.frame.grid(row=0, column=0, sticky="ew")
        form.mark(self._problems)
        self.forms[key] = form
        return scroll

    def _form_beside(self, page: Any, key: str, preview: Any) -> None:
        """The augmentation settings on the left, their live preview on the right."""
        page.grid_columnconfigure(0, weight=1, uniform="halves")
        page.grid_columnconfigure(1, weight=1, uniform="halves")
        self._form(page, key, node_fields(self.concept, self.base, key), columns=1).grid(row=0, column=0, sticky="nsew")
        preview.grid(row=0, column=1, sticky="nsew", padx=(6, 0), pady=4)

    # -- following the config ------------------------------------------------------------------------------------

    def _config_changed(self, path: str | None) -> None:
        if self._closed:
            return
        if path is None or path == "concepts" or self.index >= len(self.model.config.concepts or []):
            self.close()
            return
        if path in ("model_type", "frames"):  # the windows a clip gives depend on the model type's frame counts
            self._later("video", self._update_clip_preview)
            return
        if not path.startswith(self.base + "."):
            return
        field = path[len(self.base) + 1 :]
        if field in ("name", "path"):
            self._show_title()
        if field in ("path", "include_subdirectories"):
            self.cursor.reload()
            self._later("image", lambda: self.image_preview and self.image_preview.update_preview())
            self._later("text", lambda: self.caption_preview and self.caption_preview.update_preview())
            self._later("video", self._update_clip_preview)
        elif field.startswith("video.") or field == "video":
            self._later("video", self._update_clip_preview)
        elif field.startswith("image.") or field == "image":
            self._later("image", lambda: self.image_preview and self.image_preview.update_preview())
        elif field.startswith("text.") or field == "text":
            self._later("text", lambda: self.caption_preview and self.caption_preview.update_preview())

    def _update_clip_preview(self) -> None:
        if self.clip_preview is not None:
            self.clip_preview.update_preview()

    def _later(self, name: str, callback: Callable[[], object]) -> None:
        """Redraw a preview once typing pauses (each keystroke that changes a value lands here)."""
        pending = self._pending.pop(name, None)
        if pending is not None:
            self.after_cancel(pending)

        def run() -> None:
            self._pending.pop(name, None)
            callback()

        self._pending[name] = self.after(PREVIEW_DELAY_MS, run)

    def _show_title(self) -> None:
        concept = self.concept
        self.title(f"Concept: {concept.name or concept.path or '(unnamed)'}")
