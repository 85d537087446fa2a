"""The latest samples on the sampling tab: a tile per sample (its newest image; a clip's first frame, marked "▶ clip");
a click shows it large (a clip plays).

A new sample changes its own tile only, and the image is decoded and made small on a worker thread: a real model's
samples are megapixel files, and decoding them on the Tk thread held the window's input back at every sample."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import customtkinter as ctk

from gui.background import BackgroundResult, run_in_background
from gui.gallery import SampleGallery, SampleImage
from gui.widgets.pictures import fitted, set_picture, thumbnail_image
from gui.windows.sample_viewer import SampleViewerWindow

TILE_BOX = (150, 150)
TILES_PER_ROW = 7
MUTED_TEXT = ("gray40", "gray60")


class GalleryView:
    def __init__(
        self,
        parent: Any,
        gallery: SampleGallery,
        workspace_dir: Callable[[], str],
        sample_now: Callable[[], None] | None,
        note: Callable[[], str] = str,
    ) -> None:
        self.gallery = gallery
        self.workspace_dir = workspace_dir
        self.note = note  # a word about what the samples show (the demo's random-weight model draws noise)
        self.tiles: list[ctk.CTkFrame] = []  # in the gallery's order
        self._tiles: dict[str, tuple[SampleImage, ctk.CTkFrame]] = {}  # by sample: the image each tile shows
        self.viewer: SampleViewerWindow | None = None
        self.frame = ctk.CTkFrame(parent)
        self.frame.grid_columnconfigure(0, weight=1)
        header = ctk.CTkFrame(self.frame, fg_color="transparent")
        header.grid(row=0, column=0, sticky="ew", padx=10, pady=(6, 2))
        ctk.CTkLabel(header, text="Latest samples", font=ctk.CTkFont(size=14, weight="bold")).pack(side="left")
        self.sample_now_button = ctk.CTkButton(
            header, text="Sample now", width=110, command=sample_now or (lambda: None)
        )
        self.sample_now_button.pack(side="left", padx=(12, 4))
        self.refresh_button = ctk.CTkButton(header, text="Load from workspace", width=150, command=self.scan)
        self.refresh_button.pack(side="left", padx=4)
        self.note_label = ctk.CTkLabel(self.frame, text="", text_color=MUTED_TEXT, anchor="w", justify="left")
        self.note_label.grid(row=1, column=0, sticky="ew", padx=10)
        self.tiles_frame = ctk.CTkFrame(self.frame, fg_color="transparent")
        self.tiles_frame.grid(row=2, column=0, sticky="ew", padx=6, pady=(4, 10))
        self.empty_label = ctk.CTkLabel(
            self.tiles_frame, text="No samples yet: they appear here while training.", text_color=MUTED_TEXT
        )
        self._unsubscribe = gallery.subscribe(self.show)
        self.show()

    def scan(self) -> None:
        self.gallery.scan(self.workspace_dir())

    def show(self) -> None:
        if not self.tiles_frame.winfo_exists():
            self._unsubscribe()
            return
        self.show_note()
        images = self.gallery.images()
        keys = {image.key for image in images}
        for key in [k for k in self._tiles if k not in keys]:
            self._tiles.pop(key)[1].destroy()
        self.tiles = []
        for position, image in enumerate(images):
            shown = self._tiles.get(image.key)
            if shown is None or shown[0] != image:
                if shown is not None:
                    shown[1].destroy()
                shown = self._tiles[image.key] = (image, self._tile(image))
            shown[1].grid(row=position // TILES_PER_ROW, column=position % TILES_PER_ROW, padx=4, pady=4, sticky="n")
            self.tiles.append(shown[1])
        if self.tiles:
            self.empty_label.grid_remove()
        else:
            self.empty_label.grid(row=0, column=0, sticky="w", padx=4)

    def show_note(self) -> None:
        self.note_label.configure(text=self.note())

    def open(self, image: SampleImage) -> SampleViewerWindow:
        if self.viewer is not None and self.viewer.winfo_exists():
            self.viewer.destroy()
        self.viewer = SampleViewerWindow(self.frame, image)
        return self.viewer

    def _tile(self, image: SampleImage) -> ctk.CTkFrame:
        tile = ctk.CTkFrame(self.tiles_frame)
        picture = ctk.CTkLabel(tile, text="…", width=TILE_BOX[0], height=TILE_BOX[1])
        picture.grid(row=0, column=0, padx=6, pady=(6, 2))
        run_in_background(
            picture, lambda: thumbnail_image(image.path, TILE_BOX), lambda done: _show_picture(picture, image, done)
        )
        step = f"step {image.step}" if image.step is not None else _shorten(image.path.stem, 18)
        clip = " · ▶ clip" if image.clip else ""  # a click plays it (the viewer)
        caption = f"#{image.index + 1} · {step}{clip}\n{_shorten(image.prompt, 22)}"
        text = ctk.CTkLabel(tile, text=caption, justify="left", anchor="w", text_color=MUTED_TEXT)
        text.grid(row=1, column=0, sticky="w", padx=6, pady=(0, 6))
        for widget in (tile, picture, text):
            widget.bind("<Button-1>", lambda _e, image=image: self.open(image))
        return tile


def _show_picture(label: ctk.CTkLabel, image: SampleImage, done: BackgroundResult) -> None:
    """The tile's picture, once the worker has decoded it (or why there is none)."""
    if done.value is not None:
        set_picture(label, fitted(done.value, TILE_BOX))
    else:
        set_picture(label, None, "(file missing)" if not image.path.is_file() else "(cannot read it)")


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
