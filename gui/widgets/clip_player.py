"""A sample clip in a widget: its frames played at the clip's rate, looping, with play / pause and frame steps.

The frames are decoded once (`onetrainer.sampling.clip_files.read_clip`, on a worker thread when the caller uses
`load`) and made to fit the box; playing only swaps prepared pictures on the Tk thread's timer, so a clip plays without
decoding while it plays."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import customtkinter as ctk

from gui.background import BackgroundResult, run_in_background
from gui.widgets.pictures import fitted, set_picture
from onetrainer.sampling.clip import SampleClip

MUTED_TEXT = ("gray40", "gray60")


class ClipPlayer(ctk.CTkFrame):
    def __init__(self, master: Any, box: tuple[int, int], autoplay: bool = True, **kwargs: Any) -> None:
        super().__init__(master, fg_color="transparent", **kwargs)
        self.box = box
        self.autoplay = autoplay
        self.clip: SampleClip | None = None
        self.pictures: list[ctk.CTkImage] = []
        self.position = 0
        self.playing = False
        self._timer: str | None = None
        self.picture = ctk.CTkLabel(self, text="…", width=box[0], height=box[1])
        self.picture.grid(row=0, column=0, columnspan=4, padx=2, pady=(2, 2))
        self.back_button = ctk.CTkButton(self, text="◀", width=32, command=lambda: self.step(-1))
        self.play_button = ctk.CTkButton(self, text="▶ Play", width=76, command=self.toggle)
        self.forward_button = ctk.CTkButton(self, text="▶|", width=32, command=lambda: self.step(1))
        self.frame_label = ctk.CTkLabel(self, text="", text_color=MUTED_TEXT, anchor="w")
        for column, widget in enumerate((self.back_button, self.play_button, self.forward_button)):
            widget.grid(row=1, column=column, padx=2, pady=(0, 2), sticky="w")
        self.frame_label.grid(row=1, column=3, padx=(6, 2), pady=(0, 2), sticky="w")
        self.grid_columnconfigure(3, weight=1)
        self.bind("<Destroy>", lambda event: self._stop_timer() if event.widget is self else None, add="+")

    def load(self, path: Path) -> None:
        """Decode the clip at `path` on a worker thread and show it when done (or say why it cannot be read)."""
        from onetrainer.sampling.clip_files import read_clip

        self.stop()
        set_picture(self.picture, None, "…")
        box = self.box

        def work() -> SampleClip:
            clip = read_clip(path)
            for frame in clip.frames:  # made small here, not on the Tk thread (keeping pixels for HiDPI scaling)
                frame.thumbnail((box[0] * 2, box[1] * 2))
            return clip

        run_in_background(self, work, lambda done: self._loaded(path, done))

    def _loaded(self, path: Path, done: BackgroundResult) -> None:
        if not self.winfo_exists():
            return
        if done.error is not None or done.value is None:
            set_picture(self.picture, None, f"Cannot read {path.name}: {done.error}")
            return
        self.show_clip(done.value)

    def show_clip(self, clip: SampleClip) -> None:
        self.stop()
        self.clip = clip
        self.pictures = [fitted(frame, self.box) for frame in clip.frames]
        self.position = 0
        self._show_frame()
        if self.autoplay and len(self.pictures) > 1:
            self.play()

    @property
    def interval_ms(self) -> int:
        return max(10, round(1000 / self.clip.fps)) if self.clip is not None else 100

    def play(self) -> None:
        if not self.pictures or self.playing:
            return
        self.playing = True
        self.play_button.configure(text="❚❚ Pause")
        self._timer = self.after(self.interval_ms, self._tick)

    def stop(self) -> None:
        self.playing = False
        self._stop_timer()
        self.play_button.configure(text="▶ Play")

    def toggle(self) -> None:
        if self.playing:
            self.stop()
        else:
            self.play()

    def step(self, delta: int) -> None:
        """Pause and show the frame `delta` frames on (wrapping round the clip's ends)."""
        self.stop()
        if self.pictures:
            self.position = (self.position + delta) % len(self.pictures)
            self._show_frame()

    def _tick(self) -> None:
        self._timer = None
        if not self.playing or not self.winfo_exists():
            return
        self.position = (self.position + 1) % len(self.pictures)
        self._show_frame()
        self._timer = self.after(self.interval_ms, self._tick)

    def _show_frame(self) -> None:
        set_picture(self.picture, self.pictures[self.position])
        fps = f"{self.clip.fps:.3g}" if self.clip is not None else "?"  # a GIF's 1/0.12 s: 8.33
        self.frame_label.configure(text=f"frame {self.position + 1} / {len(self.pictures)} · {fps} fps")

    def _stop_timer(self) -> None:
        if self._timer is not None:
            with contextlib.suppress(Exception):  # the window is already gone
                self.after_cancel(self._timer)
            self._timer = None
