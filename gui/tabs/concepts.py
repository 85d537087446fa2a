"""The concepts tab: the concept settings, and a card per concept; a click on a card opens its concept window."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import customtkinter as ctk

from gui.tabs.form_tab import FormTab, TabHost
from gui.tabs.rows import WARNING_COLOR, inline_items, show_load_problems
from gui.widgets.binding import bind_self
from gui.widgets.concept_card import CARD_WIDTH, ConceptCard
from gui.windows.concept_window import ConceptWindow
from onetrainer.config import ConceptConfig
from onetrainer.config.schema import Problem

if TYPE_CHECKING:
    from gui.dialogs import Dialogs
    from gui.model import ConfigModel

CARD_GAP = 10
LIST_PATH = "concepts"
FILE_FIELD = "concept_file_name"


class ConceptsTab(FormTab):
    columns = 2
    default_group = "Concept settings"  # "Concepts" titles the cards below

    def __init__(
        self, page: Any, model: ConfigModel, dialogs: Dialogs | None, key: str = "concepts", host: TabHost | None = None
    ) -> None:
        super().__init__(page, model, dialogs, key, host)
        self.cards: list[ConceptCard] = []
        self.windows: dict[int, ConceptWindow] = {}
        self.load_problems: list[Problem] = []
        self._problems: dict[str, str] = {}
        self._card_columns = 0

        self.box = ctk.CTkFrame(self.scroll)
        self.box.grid(row=1, column=0, sticky="ew", padx=4, pady=(4, 8))
        self.box.grid_columnconfigure(0, weight=1)
        header = ctk.CTkFrame(self.box, fg_color="transparent")
        header.grid(row=0, column=0, sticky="ew", padx=10, pady=(6, 2))
        ctk.CTkLabel(header, text="Concepts", font=ctk.CTkFont(size=14, weight="bold")).pack(side="left")
        self.add_button = ctk.CTkButton(header, text="+ Add concept", width=140, command=self.add)
        self.add_button.pack(side="left", padx=12)
        self.hint = ctk.CTkLabel(header, text="Click a card to edit its concept.", text_color=("gray40", "gray60"))
        self.hint.pack(side="left", padx=6)
        self.message = ctk.CTkLabel(self.box, text="", anchor="w", justify="left", text_color=WARNING_COLOR)
        self.grid_frame = ctk.CTkFrame(self.box, fg_color="transparent")
        self.grid_frame.grid(row=2, column=0, sticky="ew", padx=6, pady=(4, 10))
        self.empty_label = ctk.CTkLabel(self.grid_frame, text="No concepts yet: add one, then choose its folder.")
        bind_self(self.grid_frame, "<Configure>", self._resized)
        model.subscribe(self._config_changed)
        self._rebuild()

    # -- the list ----------------------------------------------------------------------------------------------

    def items(self) -> list[ConceptConfig]:
        items, problems = inline_items(self.model, LIST_PATH, FILE_FIELD)
        if problems:
            self.load_problems = problems
            self._show_message()
        return items  # type: ignore[return-value]

    def add(self) -> None:
        self._changing()
        self.items().append(ConceptConfig())
        self.model.changed(LIST_PATH)

    def clone(self, index: int) -> None:
        self._changing()
        items = self.items()
        copy = items[index].copy()
        copy.name = f"{copy.name} (copy)" if copy.name else ""
        items.insert(index + 1, copy)
        self.model.changed(LIST_PATH)

    def remove(self, index: int) -> bool:
        """Delete a concept, after asking (a blank one, never set up, goes without a question)."""
        concept = self.items()[index]
        label = concept.name or concept.path
        if label and self.dialogs is not None:
            question = f"Delete the concept '{label}'?\n\nIts folder and images stay on disk."
            if not self.dialogs.ask_yes_no("Delete concept", question):
                return False
        self._changing()
        del self.items()[index]
        self.model.changed(LIST_PATH)
        return True

    def _changing(self) -> None:
        # The concepts move: an open concept window's paths would point at another concept.
        self.close_windows()

    # -- the concept window ------------------------------------------------------------------------------------

    def open(self, index: int) -> ConceptWindow:
        window = self.windows.get(index)
        if window is not None and window.winfo_exists():
            window.lift()
            window.focus()
            return window
        window = ConceptWindow(self.page, self.model, self.dialogs, index)
        window.mark(self._problems)
        self.windows[index] = window
        return window

    def close_windows(self) -> None:
        for window in self.windows.values():
            if window.winfo_exists():
                window.close()
        self.windows.clear()

    # -- FormTab -----------------------------------------------------------------------------------------------

    def refresh(self) -> None:
        super().refresh()
        self.close_windows()
        self.load_problems = []
        self._show_message()
        self._rebuild()

    def mark(self, problems: dict[str, str]) -> None:
        super().mark(problems)
        self._problems = problems
        for card in self.cards:
            prefix = card.path + "."
            card.set_problem(next((m for p, m in problems.items() if p == card.path or p.startswith(prefix)), None))
        for window in self.windows.values():
            if window.winfo_exists():
                window.mark(problems)

    # -- internals ---------------------------------------------------------------------------------------------

    def _config_changed(self, path: str | None) -> None:
        if path == LIST_PATH:
            self._rebuild()
        elif path == "model_type" and len(self.model.config.concepts or []) == len(self.cards):
            # an edit model trains only the images with reference images (cards of a config whose concepts are not
            # read yet wait for the rebuild that reads them)
            for card in self.cards:
                card.show_thumbnail()
        elif path is not None and path.startswith(LIST_PATH + "."):
            index = path.split(".")[1]
            if index.isdigit() and int(index) < len(self.cards):
                self.cards[int(index)].sync(path)

    def _rebuild(self) -> None:
        for card in self.cards:
            card.destroy()
        self.cards = [
            ConceptCard(self.grid_frame, self.model, self.dialogs, i, self.open, self.clone, self.remove)
            for i in range(len(self.items()))
        ]
        self._card_columns = 0
        self._layout()
        self.mark(self._problems)

    def _resized(self, _event: Any = None) -> None:
        self._layout()

    def _layout(self) -> None:
        width = self.grid_frame.winfo_width()
        columns = max(1, (width if width > 1 else 1200) // (CARD_WIDTH + 2 * CARD_GAP))
        if columns == self._card_columns:
            return
        self._card_columns = columns
        for i, card in enumerate(self.cards):
            card.frame.grid(row=i // columns, column=i % columns, padx=CARD_GAP // 2, pady=CARD_GAP // 2, sticky="n")
        if self.cards:
            self.empty_label.grid_remove()
        else:
            self.empty_label.grid(row=0, column=0, sticky="w", padx=4)

    def _show_message(self) -> None:
        show_load_problems(self.message, self.load_problems)
