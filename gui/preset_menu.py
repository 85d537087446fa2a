"""The preset menu: a cascading menu mirroring the folders under `presets/`."""

from __future__ import annotations

import tkinter
from collections.abc import Callable, Iterable
from typing import Any

from customtkinter import AppearanceModeTracker, ThemeManager

# A preset tree: folder name → subtree, or preset label → full preset name.
PresetTree = dict[str, "PresetTree | str"]


def preset_tree(names: Iterable[str]) -> PresetTree:
    """`["demo", "sd15/lora"]` → `{"demo": "demo", "sd15": {"lora": "sd15/lora"}}`."""
    tree: PresetTree = {}
    for name in sorted(names):
        *folders, leaf = name.split("/")
        node = tree
        for folder in folders:
            child = node.setdefault(folder, {})
            if not isinstance(child, dict):  # a preset and a folder of the same name: keep both
                child = node.setdefault(folder + "/", {})
            node = child  # type: ignore[assignment]
        node[leaf] = name
    return tree


def _themed(key: str) -> str:
    colors = ThemeManager.theme["DropdownMenu"][key]
    return colors[AppearanceModeTracker.appearance_mode] if isinstance(colors, list | tuple) else colors


def build_preset_menu(parent: Any, tree: PresetTree, command: Callable[[str], None]) -> tkinter.Menu:
    """A menu with the presets at this level first, then one cascade per folder."""
    menu = tkinter.Menu(
        parent,
        tearoff=False,
        relief="flat",
        borderwidth=0,
        background=_themed("fg_color"),
        foreground=_themed("text_color"),
        activebackground=_themed("hover_color"),
        activeforeground=_themed("text_color"),
    )
    leaves = [(label, value) for label, value in tree.items() if isinstance(value, str)]
    folders = [(label, value) for label, value in tree.items() if isinstance(value, dict)]
    for label, name in leaves:
        menu.add_command(label=label, command=lambda n=name: command(n))
    if leaves and folders:
        menu.add_separator()
    for label, subtree in folders:
        menu.add_cascade(label=label.rstrip("/"), menu=build_preset_menu(menu, subtree, command))
    if not leaves and not folders:
        menu.add_command(label="(no presets found)", state="disabled")
    return menu
