"""The tools tab's model converter: a model or LoRA into another layout, on a worker thread.

The status line speaks of the inputs it shows: a change to any of them clears the last conversion's "written: …"."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import customtkinter as ctk

from gui.background import BackgroundResult, run_in_background
from gui.dialogs import MODEL_FILES
from gui.widgets.path_entry import PathEntry, in_window_terms
from gui.window_position import place_over
from onetrainer.config import ModelFormat, ModelType, TrainingMethod
from onetrainer.config.enums import DataType
from onetrainer.config.model_types import SUPPORTED_MODEL_TYPES, model_type_info
from onetrainer.tools.convert import CONVERTIBLE_METHODS, OUTPUT_DTYPES, Conversion

if TYPE_CHECKING:
    from gui.dialogs import Dialogs

ERROR_TEXT = ("#b00020", "#ff6b6b")
OVERWRITE_TEXT = "Replace an existing destination"
# The conversion's messages are written for scripts/convert_model.py: its options as this window names them.
OPTION_FIELDS = {
    "--model-type": "Model type",
    "--training-method": "Method",
    "--input-name": "Input",
    "--base-model-name": "the Base model field",
    "--output-model-format": "Output format",
    "--output-dtype": "Output data type",
    "--output-model-destination": "Destination",
}
OPTION_PHRASES = {"(--overwrite replaces it)": f"(tick '{OVERWRITE_TEXT}' to replace it)"}


class ConvertWindow(ctk.CTkToplevel):
    def __init__(self, master: Any, dialogs: Dialogs | None = None) -> None:
        super().__init__(master)
        self.title("Convert a model")
        self.dialogs = dialogs
        self.job = None
        self.written: list[Path] = []
        self.grid_columnconfigure(1, weight=1)
        self._row = 0
        types = [m.value for m in SUPPORTED_MODEL_TYPES]
        self.model_type = self._menu("Model type", types, ModelType.STABLE_DIFFUSION_15.value)
        self.method = self._menu("Method", [m.value for m in CONVERTIBLE_METHODS], TrainingMethod.FINE_TUNE.value)
        self.paths: dict[str, PathEntry] = {}
        self.input_name = self._entry("input", "Input (model or LoRA)", ("file", "folder"))
        self.base_model = self._entry("base_model", "Base model (LoRA, embedding)", ("file", "folder"))
        self.output_format = self._menu("Output format", [], ModelFormat.ORIGINAL_SINGLE_FILE.value)
        self.output_dtype = self._menu("Output data type", [d.value for d in OUTPUT_DTYPES], DataType.FLOAT_16.value)
        self.destination = self._entry("destination", "Destination", ("save",))
        # A diffusers model is a folder: its destination is chosen as one.
        self.paths["destination"].save_kind = lambda: "folder" if self.output_format.get() == "DIFFUSERS" else "save"
        self.overwrite = ctk.CTkCheckBox(self, text=OVERWRITE_TEXT, command=self._inputs_changed)
        self.overwrite.grid(row=self._row, column=1, sticky="w", padx=(0, 12), pady=3)
        self._row += 1
        self.convert_button = ctk.CTkButton(self, text="Convert", width=120, command=self.convert)
        self.convert_button.grid(row=self._row, column=0, columnspan=2, sticky="w", padx=12, pady=(10, 4))
        self.status = ctk.CTkLabel(self, text="", anchor="w", justify="left", wraplength=480)
        self.status.grid(row=self._row + 1, column=0, columnspan=2, sticky="ew", padx=12, pady=(0, 12))
        self._text_color = self.status.cget("text_color")
        self.model_type.configure(command=lambda _v: self._update_formats())
        self.method.configure(command=lambda _v: self._update_formats())
        self.output_format.configure(command=lambda _v: self._inputs_changed())
        self.output_dtype.configure(command=lambda _v: self._inputs_changed())
        self._update_formats()
        place_over(self, master)

    def _menu(self, label: str, values: list[str], value: str) -> ctk.CTkOptionMenu:
        ctk.CTkLabel(self, text=label, anchor="w").grid(row=self._row, column=0, sticky="w", padx=(12, 6), pady=3)
        menu = ctk.CTkOptionMenu(self, values=values or [value])
        menu.set(value)
        menu.grid(row=self._row, column=1, sticky="ew", padx=(0, 12), pady=3)
        self._row += 1
        return menu

    def _entry(self, key: str, label: str, kinds: tuple[str, ...]) -> ctk.CTkEntry:
        ctk.CTkLabel(self, text=label, anchor="w").grid(row=self._row, column=0, sticky="w", padx=(12, 6), pady=3)
        variable = ctk.StringVar(self)
        field = PathEntry(self, self.dialogs, label, kinds, filetypes=MODEL_FILES, default_ext=".safetensors")
        field.entry.configure(textvariable=variable)
        variable.trace_add("write", lambda *_args: self._inputs_changed())  # typed, pasted or browsed
        field.grid(row=self._row, column=1, sticky="ew", padx=(0, 12), pady=3)
        self.paths[key] = field
        self._row += 1
        return field.entry

    def _inputs_changed(self) -> None:
        """The last conversion's result (or error) is about other inputs now: cleared (not while one runs)."""
        if self.job is not None and not self.job.done:
            return
        self.written = []
        self._show("")

    def _update_formats(self) -> None:
        """Offer the formats the chosen model type writes for the chosen method."""
        info = model_type_info(ModelType(self.model_type.get()))
        formats = [f.value for f in info.family.output_formats.get(TrainingMethod(self.method.get()), ())]
        self.output_format.configure(values=formats or ["-"])
        if self.output_format.get() not in formats:
            self.output_format.set(formats[0] if formats else "-")
        self._inputs_changed()

    def conversion(self) -> Conversion:
        return Conversion(
            model_type=ModelType(self.model_type.get()),
            input_name=self.input_name.get().strip(),
            output_format=ModelFormat(self.output_format.get()),
            destination=Path(self.destination.get().strip()),
            output_dtype=DataType(self.output_dtype.get()),
            training_method=TrainingMethod(self.method.get()),
            base_model_name=self.base_model.get().strip(),
            overwrite=bool(self.overwrite.get()),
        )

    def _show(self, text: str, error: bool = False) -> None:
        self.status.configure(text=text, text_color=ERROR_TEXT if error else self._text_color)

    def convert(self) -> bool:
        if self.job is not None and not self.job.done:
            return False
        if not self.input_name.get().strip() or not self.destination.get().strip():
            self._show("choose the input and the destination", error=True)
            return False
        conversion = self.conversion()
        problems = conversion.problems()
        if problems:
            self._show("\n".join(in_window_terms(p, OPTION_FIELDS, OPTION_PHRASES) for p in problems), error=True)
            return False
        from onetrainer.tools.convert import convert

        self.written = []
        self._show(f"converting {conversion.input_name}…")
        self.convert_button.configure(state="disabled")
        self.job = run_in_background(self, lambda: convert(conversion), self._done)
        return True

    def _done(self, result: BackgroundResult) -> None:
        self.convert_button.configure(state="normal")
        if result.error is not None:
            self._show(in_window_terms(str(result.error), OPTION_FIELDS, OPTION_PHRASES), error=True)
            return
        self.written = list(result.value)
        self._show("written: " + ", ".join(str(p) for p in self.written))
