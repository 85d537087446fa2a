"""A tab whose content is the generated form of its fields, in a scrollable frame; special tabs add to it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import customtkinter as ctk

from gui.forms.form import Form

if TYPE_CHECKING:
    from gui.dialogs import Dialogs
    from gui.gallery import SampleGallery
    from gui.model import ConfigModel


class TabHost(Protocol):
    """What tabs may ask of the main window."""

    gallery: SampleGallery

    def sample_now(self) -> None: ...


class FormTab:
    columns = 3
    default_group: str | None = None  # the frame title for fields without a group (None: the tab's name)

    def __init__(
        self, page: Any, model: ConfigModel, dialogs: Dialogs | None, key: str, host: TabHost | None = None
    ) -> None:
        self.key = key
        self.model = model
        self.dialogs = dialogs
        self.host = host
        self.page = page
        self.scroll = ctk.CTkScrollableFrame(page, fg_color="transparent")
        self.scroll.grid(row=0, column=0, sticky="nsew")
        self.scroll.grid_columnconfigure(0, weight=1)
        # Deferred: the app creates the fields a few at a time in the Tk loop's spare time (see App.tab).
        self.form = Form(
            self.scroll, model, dialogs, key, columns=self.columns, default_group=self.default_group, deferred=True
        )
        self.form.frame.grid(row=0, column=0, sticky="ew")

    def update_context(self) -> None:
        """The model type or training method changed: show the fields that apply now."""
        self.form.update()

    def refresh(self) -> None:
        """The config was replaced: show its values."""
        self.form.refresh()

    def mark(self, problems: dict[str, str]) -> None:
        self.form.mark(problems)
