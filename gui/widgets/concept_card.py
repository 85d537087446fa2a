"""A concept's card on the concepts tab: thumbnail, name, folder, enabled switch, clone and delete; a click opens it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import customtkinter as ctk
from PIL import Image

from gui.concept_preview import clip_frame, clip_rule, concept_folder, first_image
from gui.forms.fields import ERROR_COLOR, BoolView
from gui.forms.selection import item_field
from gui.widgets.pictures import fitted, set_picture, thumbnail_image
from gui.widgets.tooltip import add_tooltip
from onetrainer.config import ConceptConfig
from onetrainer.data.scan import FirstUsable, ReferenceRule, reference_rule
from onetrainer.data.video import UnreadableClip, VideoRule, is_clip

if TYPE_CHECKING:
    from gui.dialogs import Dialogs
    from gui.model import ConfigModel

CARD_WIDTH = 200
THUMBNAIL_BOX = (176, 132)
MUTED_TEXT = ("gray40", "gray60")

# Thumbnails by (folder, subfolders included, reference rule, video rule) → (the folder's modification time, its first
# usable image as found, the small image): the tab is rebuilt often. The decoded image is kept, not its Tk picture,
# which belongs to one Tk interpreter (a second window in the process, as the benchmark and tests open, could not show
# it).
_thumbnails: dict[tuple[Any, ...], tuple[int, FirstUsable | None, Image.Image | None]] = {}


def concept_thumbnail(
    concept: ConceptConfig, references: ReferenceRule | None = None, video: VideoRule | None = None
) -> tuple[FirstUsable | None, ctk.CTkImage | None]:
    """The first image of the concept's folder that trains (broken files passed over, as the trainer does), small,
    with what was found; decoded again only when the folder changes. `references`: how the model type trains on
    reference images (`scan.reference_rule`); `video`: how it trains on clips (`clip_rule`: a clip's first frame may
    be the thumbnail)."""
    folder = concept_folder(concept.path) if concept.path.strip() else None
    if folder is None or not folder.is_dir():
        return None, None
    key = (str(folder), concept.include_subdirectories, references, video)
    stamp = folder.stat().st_mtime_ns
    cached = _thumbnails.get(key)
    if cached is None or cached[0] != stamp:
        found = first_image(concept, references, video)
        image = found.image if found is not None else None
        cached = _thumbnails[key] = (stamp, found, _small(image) if image is not None else None)
    return cached[1], (fitted(cached[2], THUMBNAIL_BOX) if cached[2] is not None else None)


def _small(path: Path) -> Image.Image | None:
    """An image, or a clip's first frame, made small for a thumbnail (None when it cannot be decoded)."""
    if not is_clip(path):
        return thumbnail_image(path, THUMBNAIL_BOX)
    try:
        frame = clip_frame(path, 0)
    except UnreadableClip:
        return None
    frame.thumbnail((THUMBNAIL_BOX[0] * 2, THUMBNAIL_BOX[1] * 2))
    return frame


class ConceptCard:
    def __init__(
        self,
        parent: Any,
        model: ConfigModel,
        dialogs: Dialogs | None,
        index: int,
        on_open: Callable[[int], None],
        on_clone: Callable[[int], None],
        on_remove: Callable[[int], None],
    ) -> None:
        self.model = model
        self.index = index
        self.path = f"concepts.{index}"
        self.problem: str | None = None
        self.found: FirstUsable | None = None  # the folder's first usable image, as the thumbnail found it
        self.frame = ctk.CTkFrame(parent, width=CARD_WIDTH, border_width=2, border_color=self._normal_border())
        self.frame.grid_columnconfigure(0, weight=1)
        self.picture = ctk.CTkLabel(self.frame, text="", width=THUMBNAIL_BOX[0], height=THUMBNAIL_BOX[1])
        self.picture.grid(row=0, column=0, columnspan=3, padx=10, pady=(10, 4))
        self.name_label = ctk.CTkLabel(
            self.frame, text="", font=ctk.CTkFont(size=14, weight="bold"), anchor="w", width=CARD_WIDTH - 24
        )
        self.name_label.grid(row=1, column=0, columnspan=3, sticky="w", padx=10)
        self.folder_label = ctk.CTkLabel(
            self.frame, text="", text_color=MUTED_TEXT, anchor="w", width=CARD_WIDTH - 24, height=18
        )
        self.folder_label.grid(row=2, column=0, columnspan=3, sticky="w", padx=10)
        enabled = item_field(self.concept, "concepts", index, "enabled")
        self.enabled = BoolView(self.frame, enabled, model, dialogs, with_label=False)
        self.enabled.input.grid(row=3, column=0, sticky="w", padx=(10, 0), pady=(4, 10))
        self.enabled.visible = True
        self.clone_button = ctk.CTkButton(self.frame, text="+", width=28, command=lambda: on_clone(index))
        self.clone_button.grid(row=3, column=1, padx=2, pady=(4, 10))
        self.remove_button = ctk.CTkButton(self.frame, text="✕", width=28, command=lambda: on_remove(index))
        self.remove_button.grid(row=3, column=2, padx=(2, 10), pady=(4, 10))
        add_tooltip(self.clone_button, "Clone this concept")
        add_tooltip(self.remove_button, "Delete this concept")
        self.tooltips = add_tooltip([self.picture, self.name_label, self.folder_label], self._tooltip_text)
        for widget in (self.frame, self.picture, self.name_label, self.folder_label):
            widget.bind("<Button-1>", lambda _e: on_open(index))
        self.show_texts()
        self.show_thumbnail()

    @property
    def concept(self) -> ConceptConfig:
        return self.model.config.concepts[self.index]

    def show_texts(self) -> None:
        concept = self.concept
        folder = concept.path.strip()
        self.name_label.configure(text=_shorten(concept.name or Path(folder).name or "(unnamed)", 22))
        self.folder_label.configure(text=_shorten_start(folder, 28) if folder else "no folder chosen")

    def show_thumbnail(self) -> None:
        video, _ = clip_rule(self.model.config)
        self.found, picture = concept_thumbnail(self.concept, reference_rule(self.model.config), video)
        set_picture(self.picture, picture, "" if picture is not None else self.empty_text())

    def empty_text(self) -> str:
        """Why there is no thumbnail: no folder, a folder that does not exist, one without images, or one none of
        whose images trains (the tooltip names the files)."""
        path = self.concept.path.strip()
        if not path:
            return "no folder chosen"
        found = self.found
        if found is None:
            return "folder not found"
        if found.image is not None:
            return f"{found.image.name} cannot be shown"
        if not found.listed:
            if found.clips_need_video:  # its clips are skipped on an image model type
                count = len(found.clips_need_video)
                return f"{count} clip{'s' if count > 1 else ''}: need a video model type"
            return "images only in subfolders" if found.in_subfolders else "no images found"
        images = f"{found.listed} image{'s' if found.listed > 1 else ''}"
        if not found.without_references and not found.too_many_references:
            return f"{images}, none readable"
        if found.unreadable or (found.without_references and found.too_many_references):
            return f"{images}, none usable"
        return f"{images}, no reference images" if found.without_references else f"{images}, too many references"

    def sync(self, path: str) -> None:
        """The config changed at `path`: show what changed on this card."""
        field = path[len(self.path) + 1 :]
        if field in ("name", "path"):
            self.show_texts()
        if field in ("path", "include_subdirectories"):
            self.show_thumbnail()
        if self.enabled.watches(path):
            self.enabled.sync()

    def set_problem(self, message: str | None) -> None:
        self.problem = message
        self.frame.configure(border_color=ERROR_COLOR if message else self._normal_border())

    def _tooltip_text(self) -> str:
        text = f"{self.concept.path or 'No folder chosen.'}\nClick to edit the concept."
        reason = self.found.reason() if self.found is not None else ""
        warning = self.problem or (f"{reason[0].upper()}{reason[1:]}." if reason else "")
        return f"⚠ {warning}\n\n{text}" if warning else text

    def _normal_border(self) -> Any:
        return ctk.ThemeManager.theme["CTkFrame"]["top_fg_color"]

    def destroy(self) -> None:
        self.frame.destroy()


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _shorten_start(text: str, limit: int) -> str:
    """Paths lose their start: the folder's own name matters most."""
    return text if len(text) <= limit else "…" + text[-(limit - 1) :]
