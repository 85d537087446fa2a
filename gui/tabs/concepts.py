"""The concepts tab: the concept file setting, and a row per concept (enabled, name, folder)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gui.tabs.form_tab import FormTab
from gui.tabs.rows import RowColumn, RowsEditor
from onetrainer.config import ConceptConfig

if TYPE_CHECKING:
    from gui.dialogs import Dialogs
    from gui.model import ConfigModel

CONCEPT_COLUMNS = (
    RowColumn("enabled", "Enabled"),
    RowColumn("name", "Name"),
    RowColumn("path", "Folder", stretch=True),
)


class ConceptsTab(FormTab):
    columns = 2
    default_group = "Concept settings"  # "Concepts" titles the list below

    def __init__(self, page: Any, model: ConfigModel, dialogs: Dialogs | None, key: str = "concepts") -> None:
        super().__init__(page, model, dialogs, key)
        self.editor = RowsEditor(
            self.scroll,
            model,
            dialogs,
            list_path="concepts",
            file_field="concept_file_name",
            columns=CONCEPT_COLUMNS,
            new_item=ConceptConfig,
            title="Concepts",
            add_text="+ Add concept",
        )
        self.editor.frame.grid(row=1, column=0, sticky="ew", padx=4, pady=(4, 8))

    def update_context(self) -> None:
        super().update_context()
        self.editor.update_context()

    def refresh(self) -> None:
        super().refresh()
        self.editor.refresh()

    def mark(self, problems: dict[str, str]) -> None:
        super().mark(problems)
        self.editor.mark(problems)
