"""The tools tab's sampling window: render from a chosen model with a LoRA and embeddings, outside training.

It builds `scripts/sample.py`'s arguments and renders through the same code (`onetrainer.cli.sample.render_images`)
on a worker thread, and shows the images (a video model type's clips play in place, looping). Opened from the app,
it starts from the current config: its model type and base model, the LoRA or embedding it trains (once that file
exists), its first sample's prompt and settings (a video model type's: its frames, and the config's video format),
and the workspace's `samples/sampling-tool` folder for the images; what the config does not give comes from the last
use (kept in the app's state folder).
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import customtkinter as ctk
from PIL import Image

from gui.background import BackgroundResult, run_in_background
from gui.dialogs import MODEL_FILES
from gui.state import state_dir
from gui.widgets.clip_player import ClipPlayer
from gui.widgets.model_type_menu import ModelTypeMenu, trained_output
from gui.widgets.path_entry import PathEntry, in_window_terms
from gui.window_position import place_over
from onetrainer.config import TrainConfig, TrainingMethod
from onetrainer.config.enums import NoiseScheduler, VideoFormat
from onetrainer.sampling.clip_files import is_clip
from onetrainer.util.fs import atomic_write_json

if TYPE_CHECKING:
    from gui.dialogs import Dialogs

SETTINGS_NAME = "sampling-tool.json"
ERROR_TEXT = ("#b00020", "#ff6b6b")
THUMBNAIL = 192
CLIP_CONTROLS = 40  # the height of a clip's play controls, under its picture in the same row
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
    ("frames", "Frames (video models)", ""),
    ("device", "Device", ""),
    ("output", "Output folder", ""),
)
NUMBERS = {"width": int, "height": int, "steps": int, "cfg_scale": float, "seed": int, "count": int}
# Fields with browse buttons, and what they choose.
BROWSE = {"base_model": ("file", "folder"), "lora": ("file",), "output": ("folder",)}
OUTPUT_FOLDER = "sampling-tool"  # under the workspace's samples folder, beside the training's samples
# scripts/sample.py's options as this window names them (its messages are written for the command line).
OPTION_FIELDS = {
    "--model-type": "Model type",
    "--base-model": "Base model",
    "--lora": "LoRA",
    "--embedding": "Embeddings",
    "--prompt": "Prompt",
    "--negative-prompt": "Negative prompt",
    "--width": "Width",
    "--height": "Height",
    "--steps": "Steps",
    "--cfg-scale": "CFG scale",
    "--seed": "Seed",
    "--count": "Images",
    "--device": "Device",
    "--output": "Output folder",
    "--sampler": "Sampler",
    "--frames": "Frames",
    "--video-format": "Video format",
}


def output_folder(config: TrainConfig) -> Path:
    """Where the window writes for `config`: `<workspace_dir>/samples/sampling-tool` (never the folder the app was
    started from)."""
    return Path(config.workspace_dir).expanduser() / "samples" / OUTPUT_FOLDER


def _video(model_type) -> bool:
    """Whether the model type renders clips (its family declares `FamilyInfo.video`)."""
    from onetrainer.config.model_types import MODEL_TYPES

    info = MODEL_TYPES.get(model_type)
    return info is not None and info.family.video is not None


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def settings_path() -> Path:
    return state_dir() / SETTINGS_NAME


class SamplingWindow(ctk.CTkToplevel):
    def __init__(self, master: Any, dialogs: Dialogs | None = None, config: TrainConfig | None = None) -> None:
        super().__init__(master)
        self.title("Sample a model")
        self.dialogs = dialogs
        self.job = None
        self.images: list[Path] = []
        self._thumbnails: list[ctk.CTkImage] = []
        self.players: list[ClipPlayer] = []  # the rendered clips, playing
        self.grid_columnconfigure(1, weight=1)
        row = 0
        # The menu shows the labels the main window shows ("SD 1.5"); arguments take the model type's name.
        ctk.CTkLabel(self, text="Model type", anchor="w").grid(row=row, column=0, sticky="w", padx=(12, 6), pady=3)
        self.model_type = ModelTypeMenu(self)
        self.model_type.grid(row=row, column=1, sticky="ew", padx=(0, 12), pady=3)
        row += 1
        self.entries: dict[str, ctk.CTkEntry] = {}
        self.paths: dict[str, PathEntry] = {}
        for key, label, default in TEXT_FIELDS:
            ctk.CTkLabel(self, text=label, anchor="w").grid(row=row, column=0, sticky="w", padx=(12, 6), pady=3)
            if key in BROWSE:
                files = MODEL_FILES if key != "output" else ()
                field = PathEntry(self, dialogs, label, BROWSE[key], filetypes=files, width=380)
                self.paths[key] = field
                entry, widget = field.entry, field
            else:
                entry = widget = ctk.CTkEntry(self, width=380)
            entry.insert(0, default)
            widget.grid(row=row, column=1, sticky="ew", padx=(0, 12), pady=3)
            self.entries[key] = entry
            row += 1
        self._set("output", str(output_folder(config or TrainConfig())))
        ctk.CTkLabel(self, text="Sampler", anchor="w").grid(row=row, column=0, sticky="w", padx=(12, 6), pady=3)
        self.sampler = ctk.CTkOptionMenu(self, values=[s.value for s in NoiseScheduler])
        self.sampler.set(NoiseScheduler.DDIM.value)
        self.sampler.grid(row=row, column=1, sticky="ew", padx=(0, 12), pady=3)
        row += 1
        ctk.CTkLabel(self, text="Video format (video models)", anchor="w").grid(
            row=row, column=0, sticky="w", padx=(12, 6), pady=3
        )
        self.video_format = ctk.CTkOptionMenu(self, values=[f.value for f in VideoFormat])
        self.video_format.set(VideoFormat.MP4.value)
        self.video_format.grid(row=row, column=1, sticky="ew", padx=(0, 12), pady=3)
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
        if config is not None:
            self.take_config(config)
        place_over(self, master)

    def _set(self, key: str, value: str) -> None:
        self.entries[key].delete(0, "end")
        self.entries[key].insert(0, value)

    def take_config(self, config: TrainConfig) -> None:
        """Start from the main window's config: its model, what it trains (once written), its first enabled
        sample, and its workspace for the images. Fields it gives nothing for keep the last use's values."""
        self.model_type.set_model_type(config.model_type)
        self._set("base_model", config.base_model_name)
        self._set("output", str(output_folder(config)))
        trained = trained_output(config)
        if trained:
            if config.training_method is TrainingMethod.LORA:
                self._set("lora", trained)
            elif config.training_method is TrainingMethod.EMBEDDING:
                self._set("embeddings", trained)
        sample = next((s for s in config.samples or [] if s.enabled), None)
        if sample is not None:
            for key, value in (("prompt", sample.prompt), ("negative_prompt", sample.negative_prompt),
                               ("width", sample.width), ("height", sample.height),
                               ("steps", sample.diffusion_steps), ("cfg_scale", sample.cfg_scale),
                               ("seed", sample.seed)):  # fmt: skip
                self._set(key, f"{value:g}" if isinstance(value, float) else str(value))
            self.sampler.set(sample.noise_scheduler.value)
            if _video(config.model_type):
                self._set("frames", str(sample.frames))
        self.video_format.set(config.sample_video_format.value)

    # -- settings -------------------------------------------------------------------------------------------------

    def settings(self) -> dict[str, str]:
        values = {key: entry.get() for key, entry in self.entries.items()}
        values.update(model_type=self.model_type.model_type.value, sampler=self.sampler.get())
        values["video_format"] = self.video_format.get()
        return values

    def load_settings(self) -> None:
        try:
            saved = json.loads(settings_path().read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return  # never used yet, or a damaged file: the defaults
        for key, entry in self.entries.items():
            # The output folder is never the last use's: it follows the config (see take_config).
            if key != "output" and isinstance(saved.get(key), str):
                entry.delete(0, "end")
                entry.insert(0, saved[key])
        if isinstance(saved.get("model_type"), str):
            self.model_type.set_model_type(saved["model_type"])
        if saved.get("sampler") in self.sampler.cget("values"):
            self.sampler.set(saved["sampler"])
        if saved.get("video_format") in self.video_format.cget("values"):
            self.video_format.set(saved["video_format"])

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
        if _video(self.model_type.model_type):  # an image model type renders images: no frames, no video format
            frames = values["frames"].strip()
            if frames:
                if not frames.isdigit():
                    raise ValueError(f"Frames: '{values['frames']}' is not a number")
                args += ["--frames", frames]
            args += ["--video-format", values["video_format"]]
        if values["device"].strip():
            args += ["--device", values["device"].strip()]
        if not values["output"].strip():
            raise ValueError("choose an Output folder")
        args += ["--output", str(Path(values["output"].strip()).expanduser())]
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
            self._show(in_window_terms(str(result.error), OPTION_FIELDS), error=True)
            return
        self.images = list(result.value)
        noun = "clip" if any(is_clip(path) for path in self.images) else "image"
        where = f"{_count(len(self.images), noun)}: {self.images[0].parent}" if self.images else "nothing rendered"
        self._show(where)
        self._show_images()

    def _show_images(self) -> None:
        for child in self.gallery.winfo_children():
            child.destroy()
        self._thumbnails = []
        self.players = []
        for column, path in enumerate(self.images):
            if is_clip(path):
                player = ClipPlayer(self.gallery, (THUMBNAIL, THUMBNAIL - CLIP_CONTROLS))
                player.grid(row=0, column=column, padx=4, pady=4)
                player.load(path)
                self.players.append(player)
                continue
            with Image.open(path) as opened:
                image = opened.convert("RGB")
            image.thumbnail((THUMBNAIL, THUMBNAIL))
            picture = ctk.CTkImage(light_image=image, dark_image=image, size=image.size)
            self._thumbnails.append(picture)
            ctk.CTkLabel(self.gallery, image=picture, text="").grid(row=0, column=column, padx=4, pady=4)
