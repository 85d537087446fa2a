"""The tools tab's sampling window: render from a chosen model with a LoRA and embeddings, outside training.

It builds `scripts/sample.py`'s arguments and renders through the same code (`onetrainer.cli.sample.render_images`)
on a worker thread, shows the images, and keeps the settings of the last use in the app's state folder.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import customtkinter as ctk
from PIL import Image

from gui.background import BackgroundResult, run_in_background
from gui.state import state_dir
from onetrainer.config.enums import NoiseScheduler
from onetrainer.config.model_types import SUPPORTED_MODEL_TYPES
from onetrainer.util.fs import atomic_write_json

if TYPE_CHECKING:
    from gui.dialogs import Dialogs

SETTINGS_NAME = "sampling-tool.json"
ERROR_TEXT = ("#b00020", "#ff6b6b")
THUMBNAIL = 192
# (key, label, default): text fields, in the order shown; numbers are checked before rendering.
TEXT_FIELDS = (
    ("base_model", "Base model", ""),
    ("lora", "LoRA (optional)", ""),
    ("embeddings", "Embeddings (; between)", ""),
    ("prompt", "Prompt", ""),
    ("negative_prompt", "Negative prompt", ""),
    ("width", "Width", "512"),
    ("height", "Height", "512"),
    ("steps", "Steps", "20"),
    ("cfg_scale", "CFG scale", "7"),
    ("seed", "Seed", "42"),
    ("count", "Images", "1"),
    ("device", "Device", ""),
    ("output", "Output folder", "samples"),
)
NUMBERS = {"width": int, "height": int, "steps": int, "cfg_scale": float, "seed": int, "count": int}


def settings_path() -> Path:
    return state_dir() / SETTINGS_NAME


class SamplingWindow(ctk.CTkToplevel):
    def __init__(self, master: Any, dialogs: Dialogs | None = None) -> None:
        super().__init__(master)
        self.title("Sample a model")
        self.dialogs = dialogs
        self.job = None
        self.images: list[Path] = []
        self._thumbnails: list[ctk.CTkImage] = []
        self.grid_columnconfigure(1, weight=1)
        row = 0
        ctk.CTkLabel(self, text="Model type", anchor="w").grid(row=row, column=0, sticky="w", padx=(12, 6), pady=3)
        self.model_type = ctk.CTkOptionMenu(self, values=[m.value for m in SUPPORTED_MODEL_TYPES])
        self.model_type.grid(row=row, column=1, sticky="ew", padx=(0, 12), pady=3)
        row += 1
        self.entries: dict[str, ctk.CTkEntry] = {}
        for key, label, default in TEXT_FIELDS:
            ctk.CTkLabel(self, text=label, anchor="w").grid(row=row, column=0, sticky="w", padx=(12, 6), pady=3)
            entry = ctk.CTkEntry(self, width=380)
            entry.insert(0, default)
            entry.grid(row=row, column=1, sticky="ew", padx=(0, 12), pady=3)
            self.entries[key] = entry
            row += 1
        ctk.CTkLabel(self, text="Sampler", anchor="w").grid(row=row, column=0, sticky="w", padx=(12, 6), pady=3)
        self.sampler = ctk.CTkOptionMenu(self, values=[s.value for s in NoiseScheduler])
        self.sampler.set(NoiseScheduler.DDIM.value)
        self.sampler.grid(row=row, column=1, sticky="ew", padx=(0, 12), pady=3)
        row += 1
        self.render_button = ctk.CTkButton(self, text="Render", width=120, command=self.render)
        self.render_button.grid(row=row, column=0, columnspan=2, sticky="w", padx=12, pady=(10, 4))
        self.status = ctk.CTkLabel(self, text="", anchor="w", justify="left", wraplength=520)
        self.status.grid(row=row + 1, column=0, columnspan=2, sticky="ew", padx=12)
        self._text_color = self.status.cget("text_color")
        self.gallery = ctk.CTkScrollableFrame(self, orientation="horizontal", height=THUMBNAIL + 20)
        self.gallery.grid(row=row + 2, column=0, columnspan=2, sticky="nsew", padx=12, pady=(4, 12))
        self.grid_rowconfigure(row + 2, weight=1)
        self.load_settings()

    # -- settings -------------------------------------------------------------------------------------------------

    def settings(self) -> dict[str, str]:
        values = {key: entry.get() for key, entry in self.entries.items()}
        values.update(model_type=self.model_type.get(), sampler=self.sampler.get())
        return values

    def load_settings(self) -> None:
        try:
            saved = json.loads(settings_path().read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return  # never used yet, or a damaged file: the defaults
        for key, entry in self.entries.items():
            if isinstance(saved.get(key), str):
                entry.delete(0, "end")
                entry.insert(0, saved[key])
        for menu, key in ((self.model_type, "model_type"), (self.sampler, "sampler")):
            if saved.get(key) in menu.cget("values"):
                menu.set(saved[key])

    def save_settings(self) -> None:
        with contextlib.suppress(OSError):  # remembering the settings is a convenience; rendering goes on
            atomic_write_json(settings_path(), self.settings())

    # -- rendering ------------------------------------------------------------------------------------------------

    def arguments(self) -> list[str]:
        """`scripts/sample.py`'s arguments for the settings; ValueError naming a field that cannot work."""
        values = self.settings()
        for key, cast in NUMBERS.items():
            try:
                cast(values[key].strip())
            except ValueError:
                label = dict((k, lbl) for k, lbl, _ in TEXT_FIELDS)[key]
                raise ValueError(f"{label}: '{values[key]}' is not a number") from None
        if not values["base_model"].strip() or not values["prompt"].strip():
            raise ValueError("choose a base model and write a prompt")
        args = ["--model-type", values["model_type"], "--base-model", values["base_model"].strip()]
        args += ["--prompt", values["prompt"], "--sampler", values["sampler"]]
        if values["negative_prompt"].strip():
            args += ["--negative-prompt", values["negative_prompt"]]
        if values["lora"].strip():
            args += ["--lora", values["lora"].strip()]
        for embedding in (e.strip() for e in values["embeddings"].split(";")):
            if embedding:
                args += ["--embedding", embedding]
        for key, option in (("width", "--width"), ("height", "--height"), ("steps", "--steps"),
                            ("cfg_scale", "--cfg-scale"), ("seed", "--seed"), ("count", "--count")):  # fmt: skip
            args += [option, values[key].strip()]
        if values["device"].strip():
            args += ["--device", values["device"].strip()]
        args += ["--output", str(Path(values["output"].strip() or "samples").expanduser())]
        return args

    def _show(self, text: str, error: bool = False) -> None:
        self.status.configure(text=text, text_color=ERROR_TEXT if error else self._text_color)

    def render(self) -> bool:
        if self.job is not None and not self.job.done:
            return False
        try:
            args = self.arguments()
        except ValueError as e:
            self._show(str(e), error=True)
            return False
        self.save_settings()
        from onetrainer.cli.sample import render_images

        self._show("loading the model and rendering…")
        self.render_button.configure(state="disabled")
        self.job = run_in_background(self, lambda: render_images(args), self._done)
        return True

    def _done(self, result: BackgroundResult) -> None:
        self.render_button.configure(state="normal")
        if result.error is not None:
            self._show(str(result.error), error=True)
            return
        self.images = list(result.value)
        self._show(f"{len(self.images)} images: {self.images[0].parent}" if self.images else "nothing rendered")
        self._show_images()

    def _show_images(self) -> None:
        for child in self.gallery.winfo_children():
            child.destroy()
        self._thumbnails = []
        for column, path in enumerate(self.images):
            with Image.open(path) as opened:
                image = opened.convert("RGB")
            image.thumbnail((THUMBNAIL, THUMBNAIL))
            picture = ctk.CTkImage(light_image=image, dark_image=image, size=image.size)
            self._thumbnails.append(picture)
            ctk.CTkLabel(self.gallery, image=picture, text="").grid(row=0, column=column, padx=4, pady=4)
