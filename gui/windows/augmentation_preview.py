"""The concept window's live previews: an image and its mask as augmented, the augmented captions, and a clip with
what it gives under the concept's video settings.

All walk the concept's images and clips with previous / next (one shared position) and redraw when the concept's
settings change (a clip's augmented preview is its first frame: one draw applies to all its frames). The augmentation
itself comes from `onetrainer.data` (see `gui.concept_preview`).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import customtkinter as ctk
from PIL import UnidentifiedImageError

from gui.concept_preview import (
    ClipFrames,
    augmented_captions,
    augmented_image,
    captions_of,
    clip_facts,
    clip_windows,
    concept_items,
)
from gui.widgets.clip_player import ClipPlayer
from gui.widgets.pictures import fitted, set_picture
from onetrainer.config import ConceptConfig
from onetrainer.data.images import open_rgb
from onetrainer.data.video import UnreadableClip, VideoRule, is_clip

PREVIEW_BOX = (300, 300)
NOTE_COLOR = ("#9a6700", "#e3b341")
MUTED_TEXT = ("gray40", "gray60")
CAPTION_VARIATIONS = 4
NO_ITEMS = "No images or clips in the concept's folder."


class PreviewCursor:
    """The concept's images and clips (`images`, in the scan's order) and the one being previewed; listeners redraw
    when it moves."""

    def __init__(self, concept: Callable[[], ConceptConfig]) -> None:
        self._concept = concept
        self._images: list[Path] | None = None
        self.position = 0
        self.listeners: list[Callable[[], None]] = []

    @property
    def concept(self) -> ConceptConfig:
        return self._concept()

    def images(self) -> list[Path]:
        if self._images is None:
            self._images = concept_items(self.concept)
        return self._images

    def current(self) -> Path | None:
        images = self.images()
        return images[self.position % len(images)] if images else None

    def label(self) -> str:
        images = self.images()
        current = self.current()
        return f"{current.name}  ({self.position % len(images) + 1} / {len(images)})" if current else ""

    def move(self, delta: int) -> None:
        if self.images():
            self.position = (self.position + delta) % len(self.images())
        for listener in list(self.listeners):
            listener()

    def reload(self) -> None:
        """The concept's folder changed: list its images again."""
        self._images = None
        self.position = 0


class _PreviewPane:
    """The shared frame: a title, the file's name, previous / next / another seed buttons, and a note line."""

    title = ""

    def __init__(self, parent: Any, cursor: PreviewCursor) -> None:
        self.cursor = cursor
        self.seed = cursor.concept.seed
        self.frame = ctk.CTkFrame(parent)
        self.frame.grid_columnconfigure(0, weight=1)
        ctk.CTkLabel(self.frame, text=self.title, font=ctk.CTkFont(size=14, weight="bold"), anchor="w").grid(
            row=0, column=0, sticky="w", padx=10, pady=(8, 2)
        )
        bar = ctk.CTkFrame(self.frame, fg_color="transparent")
        bar.grid(row=1, column=0, sticky="ew", padx=10)
        self.previous_button = ctk.CTkButton(bar, text="◀ Previous", width=96, command=lambda: cursor.move(-1))
        self.next_button = ctk.CTkButton(bar, text="Next ▶", width=80, command=lambda: cursor.move(1))
        self.reroll_button = ctk.CTkButton(bar, text="Another seed", width=110, command=self.reroll)
        for button in (self.previous_button, self.next_button, self.reroll_button):
            button.pack(side="left", padx=(0, 6))
        self.file_label = ctk.CTkLabel(self.frame, text="", anchor="w", text_color=MUTED_TEXT)
        self.file_label.grid(row=2, column=0, sticky="w", padx=10, pady=(4, 0))
        self.note = ctk.CTkLabel(self.frame, text="", anchor="w", justify="left", text_color=NOTE_COLOR, wraplength=440)
        self.note.grid(row=4, column=0, sticky="ew", padx=10, pady=(4, 10))
        cursor.listeners.append(self.update_preview)

    def reroll(self) -> None:
        """Show another random draw of the same settings."""
        self.seed = random.randrange(2**31)
        self.update_preview()

    def update_preview(self) -> None:
        raise NotImplementedError

    def _note(self, text: str) -> None:
        self.note.configure(text=text)


class ImagePreview(_PreviewPane):
    title = "Preview"

    def __init__(self, parent: Any, cursor: PreviewCursor) -> None:
        super().__init__(parent, cursor)
        pictures = ctk.CTkFrame(self.frame, fg_color="transparent")
        pictures.grid(row=3, column=0, sticky="nsew", padx=10, pady=(6, 0))
        self.frame.grid_rowconfigure(3, weight=1)
        self.image_label = ctk.CTkLabel(pictures, text="", width=PREVIEW_BOX[0], height=PREVIEW_BOX[1])
        self.mask_label = ctk.CTkLabel(pictures, text="", width=PREVIEW_BOX[0] // 2, height=PREVIEW_BOX[1] // 2)
        self.image_label.grid(row=0, column=0, sticky="nw", rowspan=3)
        self.mask_label.grid(row=0, column=1, sticky="nw", padx=(8, 0))
        ctk.CTkLabel(pictures, text="augmented image", text_color=MUTED_TEXT).grid(row=3, column=0, sticky="w")
        ctk.CTkLabel(pictures, text="its mask (white = trained)", text_color=MUTED_TEXT).grid(
            row=1, column=1, sticky="nw", padx=(8, 0)
        )
        # An edit model's inputs beside the image it learns to make (`<name>-reference[-N].<ext>`).
        self.reference_label = ctk.CTkLabel(pictures, text="", width=PREVIEW_BOX[0] // 2, height=PREVIEW_BOX[1] // 2)
        self.reference_label.grid(row=2, column=1, sticky="nw", padx=(8, 0), pady=(8, 0))
        self.reference_caption = ctk.CTkLabel(pictures, text="", text_color=MUTED_TEXT, justify="left")
        self.reference_caption.grid(row=3, column=1, sticky="nw", padx=(8, 0))
        self.last = None  # the last AugmentedImage shown (tests look at it)

    def update_preview(self) -> None:
        path = self.cursor.current()
        self.file_label.configure(text=self.cursor.label())
        if path is None:
            self._clear(NO_ITEMS if self.cursor.concept.path else "Choose a folder first.")
            return
        try:
            result = augmented_image(path, self.cursor.concept, self.seed)
        except (OSError, UnidentifiedImageError, UnreadableClip) as e:
            self._clear(f"Cannot read {path.name}: {e}")
            return
        except Exception as e:  # a setting the augmentation refuses: say which, keep the window alive
            self._clear(f"The augmentation failed: {e}")
            return
        self.last = result
        set_picture(self.image_label, fitted(result.image, PREVIEW_BOX))
        if result.mask is not None:
            box = (PREVIEW_BOX[0] // 2, PREVIEW_BOX[1] // 2)
            set_picture(self.mask_label, fitted(result.mask.convert("RGB"), box))
        else:
            set_picture(self.mask_label, None, "no mask file:\nthe whole image trains")
        self._show_references(result.references)
        clip = f"A clip: its first frame, as augmented (one draw applies to all its frames). {result.note}"
        self._note(clip.strip() if is_clip(path) else result.note)

    def _show_references(self, references: list) -> None:
        """The image's first reference image and how many it has (edit models learn from them; others ignore them)."""
        if not references:
            set_picture(self.reference_label, None)
            self.reference_caption.configure(text="")
            return
        box = (PREVIEW_BOX[0] // 2, PREVIEW_BOX[1] // 2)
        try:
            set_picture(self.reference_label, fitted(open_rgb(references[0]), box))
        except (OSError, UnidentifiedImageError) as e:
            set_picture(self.reference_label, None, f"cannot read {references[0].name}: {e}")
        count = len(references)
        self.reference_caption.configure(text=f"reference image{'s' if count > 1 else ''}: {count} (first shown)")

    def _clear(self, message: str) -> None:
        self.last = None
        set_picture(self.image_label, None)
        set_picture(self.mask_label, None)
        self._show_references([])
        self._note(message)


class CaptionPreview(_PreviewPane):
    title = "Captions"

    def __init__(self, parent: Any, cursor: PreviewCursor) -> None:
        super().__init__(parent, cursor)
        box = ctk.CTkFrame(self.frame, fg_color="transparent")
        box.grid(row=3, column=0, sticky="nsew", padx=10, pady=(6, 0))
        box.grid_columnconfigure(0, weight=1)
        self.frame.grid_rowconfigure(3, weight=1)
        ctk.CTkLabel(box, text="caption lines (one is drawn per epoch)", text_color=MUTED_TEXT).grid(
            row=0, column=0, sticky="w"
        )
        self.original = ctk.CTkTextbox(box, height=90, wrap="word", activate_scrollbars=False)
        self.original.grid(row=1, column=0, sticky="ew")
        ctk.CTkLabel(box, text="as augmented, a few draws", text_color=MUTED_TEXT).grid(
            row=2, column=0, sticky="w", pady=(8, 0)
        )
        self.augmented = ctk.CTkTextbox(box, height=170, wrap="word", activate_scrollbars=False)
        self.augmented.grid(row=3, column=0, sticky="nsew")
        self.captions: list[str] = []
        self.variations: list[str] = []

    def update_preview(self) -> None:
        path = self.cursor.current()
        self.file_label.configure(text=self.cursor.label())
        concept = self.cursor.concept
        self.captions, self.variations, note = [], [], ""
        if path is None:
            note = NO_ITEMS if concept.path else "Choose a folder first."
        else:
            try:
                self.captions = captions_of(path, concept)
                self.variations, note = augmented_captions(self.captions, concept, self.seed, CAPTION_VARIATIONS)
            except Exception as e:  # an unreadable caption file or a refused setting: shown, not raised
                note = f"Cannot make the captions: {e}"
            if not self.captions and not note:
                kind = "clip" if is_clip(path) else "image"
                note = f"This {kind} has no caption (it trains with an empty prompt)."
        _set_text(self.original, "\n".join(self.captions))
        _set_text(self.augmented, "\n".join(f"• {line}" for line in self.variations))
        self._note(note)


class ClipPreview(_PreviewPane):
    """A clip as stored (no augmentation): a frame at a time from its first, its frames, duration and rate, and the
    windows it gives under the concept's video settings for the model type (`rule`: `concept_preview.clip_rule`)."""

    title = "Clip"

    def __init__(self, parent: Any, cursor: PreviewCursor, rule: Callable[[], tuple[VideoRule | None, str]]) -> None:
        super().__init__(parent, cursor)
        self.rule = rule
        self.reroll_button.pack_forget()  # the frames as stored: there is no random draw to redo
        body = ctk.CTkFrame(self.frame, fg_color="transparent")
        body.grid(row=3, column=0, sticky="nsew", padx=10, pady=(6, 0))
        self.frame.grid_rowconfigure(3, weight=1)
        # the app's one clip widget (as the sample viewer's): first frame, frame steps, play / pause, the rate
        self.player = ClipPlayer(body, PREVIEW_BOX, autoplay=False)
        self.player.grid(row=0, column=0, rowspan=2, sticky="nw")
        self.picture = self.player.picture  # a still is shown in the player's picture, its controls off
        self.previous_frame_button = self.player.back_button
        self.next_frame_button = self.player.forward_button
        self.frame_label = self.player.frame_label
        self.facts = ctk.CTkLabel(body, text="", anchor="w", justify="left", wraplength=440)
        self.facts.grid(row=2, column=0, sticky="w", pady=(6, 0))
        self.windows = ctk.CTkLabel(body, text="", anchor="w", justify="left", wraplength=440)
        self.windows.grid(row=3, column=0, sticky="w")
        self.clip: ClipFrames | None = None  # the clip shown (None: an image, an unreadable clip or nothing)
        self.shown: Path | None = None
        self.unreadable = ""  # why the clip shown cannot be read

    def update_preview(self) -> None:
        """Show the cursor's item (keeping the frame shown when it is the same clip: the settings changed)."""
        path = self.cursor.current()
        self.file_label.configure(text=self.cursor.label())
        if path != self.shown:
            self.shown, self.clip, self.unreadable = path, None, ""
            if path is not None and is_clip(path):
                try:
                    self.clip = ClipFrames(path)
                except UnreadableClip as e:
                    self.unreadable = f"{path.name} cannot be read: {e}. The scan names it and skips it."
        if path is None:
            self._show_nothing(NO_ITEMS if self.cursor.concept.path else "Choose a folder first.")
        elif self.unreadable:
            self._show_nothing(self.unreadable)
        elif self.clip is None:
            self._show_still(path)
        else:
            self._show_clip(self.clip)

    def step(self, delta: int) -> None:
        """Show the frame `delta` frames on (round the clip's ends)."""
        if self.clip is not None:
            self.player.step(delta)

    def _show_clip(self, clip: ClipFrames) -> None:
        rule, error = self.rule()
        self.facts.configure(text=clip_facts(clip.header))
        self.windows.configure(text=clip_windows(clip.header, self.cursor.concept, rule, error))
        if self.player.clip is not clip:  # a new clip: from its first frame; a settings change keeps the frame shown
            self.player.show_source(clip)
        self._note(self.player.error)

    def _show_still(self, path: Path) -> None:
        rule, error = self.rule()
        self.player.clear()
        self.windows.configure(text="")
        try:
            image = open_rgb(path)
        except (OSError, UnidentifiedImageError) as e:
            self._show_nothing(f"Cannot read {path.name}: {e}")
            return
        set_picture(self.picture, fitted(image, PREVIEW_BOX))
        self.facts.configure(text=f"a still image, {image.width}x{image.height}")
        if error:
            self._note(error)
        elif rule is None:
            self._note("A still: it trains as an image on this model type (and as a one-frame clip on a video one).")
        else:
            self._note(f"A still: it trains as a one-frame clip on {rule.label}.")

    def _show_nothing(self, message: str) -> None:
        self.player.clear()
        for label in (self.facts, self.windows):
            label.configure(text="")
        self._note(message)


def _set_text(box: ctk.CTkTextbox, text: str) -> None:
    box.configure(state="normal")
    box.delete("1.0", "end")
    box.insert("1.0", text)
    box.configure(state="disabled")
