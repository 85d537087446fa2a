"""A sample's images, large, with previous / next through the run's history of that sample; a clip (a video model's
sample) plays in place of the image, looping, with play / pause and frame steps."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import customtkinter as ctk
from PIL import UnidentifiedImageError

from gui.gallery import SampleImage, sample_history
from gui.widgets.clip_player import ClipPlayer
from gui.widgets.pictures import fitted, set_picture
from gui.window_position import place_over
from onetrainer.data.images import open_rgb
from onetrainer.sampling.clip_files import is_clip

VIEW_BOX = (640, 640)


class SampleViewerWindow(ctk.CTkToplevel):
    def __init__(self, master: Any, sample: SampleImage) -> None:
        super().__init__(master)
        self.sample = sample
        self.title(f"Sample {sample.index + 1}: {sample.prompt}")
        place_over(self, master, (720, 780))
        self.grid_columnconfigure(0, weight=1)
        self.grid_rowconfigure(1, weight=1)
        bar = ctk.CTkFrame(self, fg_color="transparent")
        bar.grid(row=0, column=0, sticky="ew", padx=10, pady=(10, 4))
        ctk.CTkButton(bar, text="◀ Older", width=90, command=lambda: self.move(-1)).pack(side="left")
        ctk.CTkButton(bar, text="Newer ▶", width=90, command=lambda: self.move(1)).pack(side="left", padx=6)
        self.caption = ctk.CTkLabel(bar, text="", anchor="w")
        self.caption.pack(side="left", padx=8)
        self.picture = ctk.CTkLabel(self, text="")
        self.picture.grid(row=1, column=0, sticky="nsew", padx=10, pady=10)
        self.player = ClipPlayer(self, VIEW_BOX)  # shown in the picture's place for a clip
        self.history: list[Path] = sample_history(sample.path.parent) or [sample.path]
        self.position = self.history.index(sample.path) if sample.path in self.history else len(self.history) - 1
        self.show()

    def move(self, delta: int) -> None:
        self.history = sample_history(self.sample.path.parent) or self.history
        self.position = max(0, min(len(self.history) - 1, self.position + delta))
        self.show()

    def show(self) -> None:
        path = self.history[self.position]
        self.caption.configure(text=f"{path.name}  ({self.position + 1} / {len(self.history)})")
        if is_clip(path):
            self.picture.grid_remove()
            self.player.grid(row=1, column=0, sticky="nsew", padx=10, pady=10)
            self.player.load(path)
            return
        self.player.stop()
        self.player.grid_remove()
        self.picture.grid()
        try:
            set_picture(self.picture, fitted(open_rgb(path), VIEW_BOX))
        except (OSError, UnidentifiedImageError) as e:
            set_picture(self.picture, None, f"Cannot read {path}: {e}")
