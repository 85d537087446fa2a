"""The tools tab: the tools that exist, each opening its own window (dataset tool, masks, captions, conversion, LoRA
tools, sampling)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import customtkinter as ctk

from gui.tabs.form_tab import FormTab, TabHost
from gui.windows.dataset_tool import DatasetToolWindow

if TYPE_CHECKING:
    from gui.dialogs import Dialogs
    from gui.model import ConfigModel

MUTED_TEXT = ("gray40", "gray60")
DATASET_TOOL_TEXT = (
    "Walk through a folder of training images: edit each caption (<image>.txt) and paint the training mask "
    "(<image>-masklabel.png, white = trained)."
)

AUTOMATIC_TOOLS = (
    ("masks", "Generate masks", "Masks for a folder of images: ClipSeg from prompts, background removal, a colour."),
    ("captions", "Generate captions", "Captions for a folder of images: BLIP, BLIP-2, WD14 tags, Florence-2."),
    ("convert", "Convert model", "A model between a diffusers folder and a single file; a LoRA between layouts."),
    (
        "lora",
        "LoRA tools",
        "Merge a LoRA into its model, extract one from a fine-tune, resize, merge several, average checkpoints.",
    ),
    ("sampling", "Sample a model", "Render images from a model with a LoRA and embeddings, outside training."),
)


class ToolsTab(FormTab):
    columns = 1

    def __init__(
        self, page: Any, model: ConfigModel, dialogs: Dialogs | None, key: str = "tools", host: TabHost | None = None
    ) -> None:
        super().__init__(page, model, dialogs, key, host)
        self.dataset_tool: DatasetToolWindow | None = None
        box = ctk.CTkFrame(self.scroll)
        box.grid(row=1, column=0, sticky="ew", padx=4, pady=(4, 8))
        box.grid_columnconfigure(1, weight=1)
        ctk.CTkLabel(box, text="Tools", font=ctk.CTkFont(size=14, weight="bold"), anchor="w").grid(
            row=0, column=0, columnspan=2, sticky="w", padx=10, pady=(6, 4)
        )
        self.dataset_button = ctk.CTkButton(box, text="Dataset tool", width=160, command=self.open_dataset_tool)
        self.dataset_button.grid(row=1, column=0, sticky="nw", padx=10, pady=(2, 12))
        about = ctk.CTkLabel(box, text=DATASET_TOOL_TEXT, text_color=MUTED_TEXT, justify="left", wraplength=700)
        about.grid(row=1, column=1, sticky="w", padx=6, pady=(2, 12))
        self.tool_windows: dict[str, Any] = {}
        self.tool_buttons: dict[str, ctk.CTkButton] = {}
        for row, (key, label, text) in enumerate(AUTOMATIC_TOOLS, start=2):
            button = ctk.CTkButton(box, text=label, width=160, command=lambda k=key: self.open_tool(k))
            button.grid(row=row, column=0, sticky="nw", padx=10, pady=(2, 12))
            self.tool_buttons[key] = button
            ctk.CTkLabel(box, text=text, text_color=MUTED_TEXT, justify="left", wraplength=700).grid(
                row=row, column=1, sticky="w", padx=6, pady=(2, 12)
            )

    def open_dataset_tool(self, folder: str | None = None) -> DatasetToolWindow:
        """The dataset tool, opened on `folder` (else on the first concept's folder, when there is one)."""
        window = self.dataset_tool
        if window is None or not window.winfo_exists():
            window = DatasetToolWindow(self.page, self.dialogs, folder or self._first_concept_folder())
            from gui.windows.dataset_tool_auto import attach_automation

            attach_automation(window)  # automatic masks and captions for the shown image or the folder
            self.dataset_tool = window
        else:
            window.lift()
            if folder:
                window.open_folder(folder)
        return window

    def open_tool(self, key: str) -> Any:
        """The mask, caption, conversion, LoRA tools or sampling window (one of each; shown again when open)."""
        window = self.tool_windows.get(key)
        if window is not None and window.winfo_exists():
            window.lift()
            return window
        from gui.windows.convert_window import ConvertWindow
        from gui.windows.tool_pass_window import CaptionWindow, MaskWindow

        if key == "convert":
            window = ConvertWindow(self.page, self.dialogs)
        elif key == "lora":
            from gui.windows.lora_tool_window import LoraToolWindow

            window = LoraToolWindow(self.page, self.dialogs, self.model.config)
        elif key == "sampling":
            from gui.windows.sampling_tool import SamplingWindow
            from onetrainer.config import pack

            # Packed: the samples of the config's sample file too (the window starts from the first one).
            window = SamplingWindow(self.page, self.dialogs, pack(self.model.config)[0])
        else:
            window = {"masks": MaskWindow, "captions": CaptionWindow}[key](
                self.page, self.dialogs, self._first_concept_folder()
            )
        self.tool_windows[key] = window
        return window

    def _first_concept_folder(self) -> str | None:
        from gui.concept_preview import concept_folder
        from onetrainer.families.sources import source_for

        for concept in self.model.config.concepts or []:
            if concept.path.strip() and source_for(concept.path) is None:  # not a name a source builds on demand
                folder = concept_folder(concept.path)
                if folder.is_dir():
                    return str(folder)
        return None
