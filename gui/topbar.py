"""The top bar: presets, load / save config, and the model type and training method that decide the rest."""

from __future__ import annotations

import tkinter
from collections.abc import Callable
from typing import Any

import customtkinter as ctk

from gui.labels import method_label, model_type_choices, model_type_label, offered_methods
from gui.model import ConfigModel
from gui.preset_menu import build_preset_menu, preset_tree
from gui.widgets.tooltip import add_tooltip
from onetrainer.config import TrainConfig
from onetrainer.config.enums import ModelType, TrainingMethod

MY_PRESETS = "My presets"
SAVE_PRESET = "Save current settings as my preset…"


class TopBar(ctk.CTkFrame):
    def __init__(
        self,
        master: Any,
        model: ConfigModel,
        *,
        list_presets: Callable[[], list[str]],
        on_preset: Callable[[str], None],
        on_load: Callable[[], None],
        on_save: Callable[[], None],
        list_user_presets: Callable[[], list[str]] = list,
        on_user_preset: Callable[[str], None] | None = None,
        on_save_preset: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(master, corner_radius=0)
        self.model = model
        self._list_presets = list_presets
        self._on_preset = on_preset
        self._list_user_presets = list_user_presets
        self._on_user_preset = on_user_preset
        self._on_save_preset = on_save_preset
        self.preset_menu: tkinter.Menu | None = None

        self.preset_button = ctk.CTkButton(self, text="Load preset ▾", width=130, command=self.open_preset_menu)
        self.load_button = ctk.CTkButton(self, text="Load config", width=110, command=on_load)
        self.save_button = ctk.CTkButton(self, text="Save config", width=110, command=on_save)
        for i, button in enumerate((self.preset_button, self.load_button, self.save_button)):
            button.grid(row=0, column=i, padx=(10 if i == 0 else 4, 4), pady=8)
        self.grid_columnconfigure(3, weight=1)

        help_of = {s.name: s.meta.help for s in TrainConfig.specs()}
        self._model_types = model_type_choices()
        model_label = ctk.CTkLabel(self, text="Model type")
        model_label.grid(row=0, column=4, padx=(8, 4))
        self.model_type_menu = ctk.CTkOptionMenu(
            self, values=[label for label, _ in self._model_types], command=self._model_type_chosen, width=250,
            dynamic_resizing=False,
        )  # fmt: skip
        self.model_type_menu.grid(row=0, column=5, padx=4)
        add_tooltip([model_label, self.model_type_menu], help_of["model_type"])
        method_text = ctk.CTkLabel(self, text="Training method")
        method_text.grid(row=0, column=6, padx=(12, 4))
        self.method_menu = ctk.CTkOptionMenu(self, values=[], command=self._method_chosen, width=130)
        self.method_menu.grid(row=0, column=7, padx=(4, 10))
        add_tooltip([method_text, self.method_menu], help_of["training_method"])
        self._methods: list[TrainingMethod] = []
        self.refresh()

    # -- presets -----------------------------------------------------------------------------------------------

    def build_preset_menu(self) -> tkinter.Menu:
        """Built on each opening, so presets added while the app runs appear: the bundled ones, then the user's own
        ("My presets") and the entry that saves one."""
        if self.preset_menu is not None:
            self.preset_menu.destroy()
        menu = build_preset_menu(self, preset_tree(self._list_presets()), self._on_preset)
        if self._on_user_preset is not None:
            menu.add_separator()
            mine = self._list_user_presets()
            if mine:
                menu.add_cascade(
                    label=MY_PRESETS, menu=build_preset_menu(menu, preset_tree(mine), self._on_user_preset)
                )
            else:
                menu.add_command(label=f"{MY_PRESETS}: none saved yet", state="disabled")
        if self._on_save_preset is not None:
            menu.add_command(label=SAVE_PRESET, command=self._on_save_preset)
        self.preset_menu = menu
        return menu

    def open_preset_menu(self) -> None:
        menu = self.build_preset_menu()
        x = self.preset_button.winfo_rootx()
        y = self.preset_button.winfo_rooty() + self.preset_button.winfo_height()
        try:
            menu.tk_popup(x, y)
        finally:
            menu.grab_release()

    # -- model type and method -----------------------------------------------------------------------------------

    def refresh(self) -> None:
        """Show the config's model type and method, and offer the methods of its family."""
        config = self.model.config
        # The labels say which families train (the registry), so they are read again rather than kept from startup.
        choices = model_type_choices()
        if choices != self._model_types:
            self._model_types = choices
            self.model_type_menu.configure(values=[label for label, _ in choices])
        self.model_type_menu.set(model_type_label(config.model_type))
        self._methods = list(offered_methods(config.model_type))
        self.method_menu.configure(values=[method_label(m) for m in self._methods])
        self.method_menu.set(method_label(config.training_method))

    def choose_model_type(self, model_type: ModelType) -> None:
        """What picking a model type does: set it, and move to an offered method when the current one is not."""
        self.model.set("model_type", model_type.name)
        methods = offered_methods(model_type)
        if self.model.config.training_method not in methods:
            self.model.set("training_method", methods[0].name)
        self.refresh()

    def choose_method(self, method: TrainingMethod) -> None:
        self.model.set("training_method", method.name)
        self.refresh()

    def _model_type_chosen(self, label: str) -> None:
        for text, model_type in self._model_types:
            if text == label:
                self.choose_model_type(model_type)
                return

    def _method_chosen(self, label: str) -> None:
        for method in self._methods:
            if method_label(method) == label:
                self.choose_method(method)
                return
