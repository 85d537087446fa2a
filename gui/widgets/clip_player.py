"""The one clip widget of the app: a clip's frames in a box, its first frame shown first, with play / pause (at the
clip's rate, looping), frame steps that wrap round its ends, and "frame n / N · fps". The sample viewer, the sampling
tool and the concept window's clip page all show clips with it.

What it shows comes from a frame source (`FrameSource`: a count, a rate, a frame by number):
- `DecodedFrames`, a clip decoded whole beforehand (a sample: `load` decodes it on a worker thread with
  `onetrainer.sampling.clip_files.read_clip`, made small there), its pictures all prepared at once, so playing only
  swaps pictures on the Tk thread's timer;
- `gui.concept_preview.ClipFrames`, a training clip decoded in runs of frames as they are asked for (a user's clip
  may be long and large: it is never decoded whole), each frame's picture prepared once when first shown.

The dataset tool shows a clip's frames on its own (zoomable) canvas: its player is the controls alone (`display`, called
when the frame shown changes, draws it there).

A frame that cannot be decoded (a clip that ends before its header said) is said in the picture's place, and playing
stops there."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import customtkinter as ctk
from PIL import Image

from gui.background import BackgroundResult, run_in_background
from gui.widgets.pictures import fitted, set_picture
from onetrainer.sampling.clip import SampleClip

MUTED_TEXT = ("gray40", "gray60")


class FrameSource(Protocol):
    """What the player shows: `count` frames at `fps` (0: unknown), frame `index` as a picture (an exception naming
    why when it cannot be decoded)."""

    @property
    def count(self) -> int: ...

    @property
    def fps(self) -> float: ...

    def frame_at(self, index: int) -> Image.Image: ...


class DecodedFrames:
    """A clip decoded whole (a sample's `SampleClip`) as a frame source."""

    def __init__(self, clip: SampleClip) -> None:
        self.clip = clip

    @property
    def count(self) -> int:
        return len(self.clip.frames)

    @property
    def fps(self) -> float:
        return self.clip.fps

    @property
    def frames(self) -> list[Image.Image]:
        return self.clip.frames

    def frame_at(self, index: int) -> Image.Image:
        return self.clip.frames[index]


class ClipPlayer(ctk.CTkFrame):
    def __init__(
        self,
        master: Any,
        box: tuple[int, int],
        autoplay: bool = True,
        display: Callable[[], None] | None = None,
        **kwargs: Any,
    ) -> None:
        """`display`: the controls alone, the frame shown drawn by the caller (`display()` after each change; the
        source's `frame_at` has just been asked for it, so its own cache holds it)."""
        super().__init__(master, fg_color="transparent", **kwargs)
        self.box = box
        self.autoplay = autoplay
        self.display = display
        self.clip: FrameSource | None = None  # the source shown
        self.pictures: list[ctk.CTkImage | None] = []  # one per frame, prepared when first shown (or all at once)
        self.position = 0
        self.playing = False
        self.error = ""  # why the frame shown cannot be decoded ("" when it is shown)
        self._timer: str | None = None
        self.picture = ctk.CTkLabel(self, text="…", width=box[0], height=box[1])
        if display is None:
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

    # -- what is shown --------------------------------------------------------------------------------------------

    def load(self, path: Path) -> None:
        """Decode the clip at `path` whole on a worker thread and show it when done (or say why it cannot be read)."""
        from onetrainer.sampling.clip_files import read_clip

        self.clear("…")
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
        """Show a clip decoded whole, its pictures prepared at once."""
        source = DecodedFrames(clip)
        self.show_source(source, [fitted(frame, self.box) for frame in clip.frames])

    def show_source(self, source: FrameSource, pictures: list[ctk.CTkImage] | None = None, position: int = 0) -> None:
        """Show `source` from frame `position` (its first by default), playing at once where `autoplay` is on."""
        self.stop()
        self.clip = source
        self.pictures = list(pictures) if pictures is not None else [None] * source.count
        self.position = position % max(1, source.count)
        self._show_frame()
        state = "normal" if source.count > 1 else "disabled"
        for button in (self.back_button, self.play_button, self.forward_button):
            button.configure(state=state)
        if self.autoplay and source.count > 1:
            self.play()

    def clear(self, text: str = "") -> None:
        """Show nothing (`text` in the picture's place), the controls off."""
        self.stop()
        self.clip, self.pictures, self.position, self.error = None, [], 0, ""
        set_picture(self.picture, None, text)
        self.frame_label.configure(text="")
        for button in (self.back_button, self.play_button, self.forward_button):
            button.configure(state="disabled")

    # -- playing and stepping -------------------------------------------------------------------------------------

    @property
    def interval_ms(self) -> int:
        fps = self.clip.fps if self.clip is not None else 0
        return max(10, round(1000 / fps)) if fps > 0 else 100

    def play(self) -> None:
        if not self.pictures or self.playing or len(self.pictures) < 2:
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
        if not self._show_frame():
            self.stop()
            return
        self._timer = self.after(self.interval_ms, self._tick)

    def _show_frame(self) -> bool:
        """Show the frame at `position`; False (the reason in the picture's place) when it cannot be decoded."""
        count = len(self.pictures)
        fps = self.clip.fps if self.clip is not None else 0
        rate = f" · {fps:.3g} fps" if fps > 0 else ""  # a GIF's 1/0.12 s: 8.33
        self.frame_label.configure(text=f"frame {self.position + 1} / {count}{rate}")
        if self.display is not None:
            try:
                self.clip.frame_at(self.position)
                self.error = ""
            except Exception as e:
                self.error = f"Cannot decode frame {self.position + 1}: {e}"
            self.display()
            return not self.error
        picture = self.pictures[self.position]
        if picture is None:
            try:
                picture = self.pictures[self.position] = fitted(self.clip.frame_at(self.position), self.box)
            except Exception as e:
                self.error = f"Cannot decode frame {self.position + 1}: {e}"
                set_picture(self.picture, None, self.error)
                return False
        self.error = ""
        set_picture(self.picture, picture)
        return True

    def _stop_timer(self) -> None:
        if self._timer is not None:
            with contextlib.suppress(Exception):  # the window is already gone
                self.after_cancel(self._timer)
            self._timer = None
