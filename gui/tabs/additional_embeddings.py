"""The additional embeddings tab: embeddings trained alongside a LoRA or fine-tune, one row each."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from gui.tabs.form_tab import TabHost
from gui.tabs.rows import RowColumn, RowsEditor, RowsFormTab
from onetrainer.config.embedding_config import TrainEmbeddingConfig

if TYPE_CHECKING:
    from gui.dialogs import Dialogs
    from gui.model import ConfigModel

LIST_PATH = "additional_embeddings"
EMBEDDING_COLUMNS = (
    RowColumn("placeholder", "Placeholder"),
    RowColumn("token_count", "Tokens"),
    RowColumn("initial_embedding_text", "Initial text"),
    RowColumn("model_name", "Base embedding file", stretch=True),
    RowColumn("train", "Train"),
    RowColumn("learning_rate", "Learning rate"),
)


def unique_placeholder(taken: set[str]) -> str:
    """`<embedding-1>`, `<embedding-2>`, …: the first not used yet (each embedding needs its own word)."""
    n = 1
    while f"<embedding-{n}>" in taken:
        n += 1
    return f"<embedding-{n}>"


def clone_embedding(embedding: TrainEmbeddingConfig) -> TrainEmbeddingConfig:
    """A copy with its own uuid: backups tell embeddings apart by it."""
    copy = embedding.copy()
    copy.uuid = str(uuid.uuid4())
    return copy


class AdditionalEmbeddingsTab(RowsFormTab):
    columns = 1

    def __init__(
        self,
        page: Any,
        model: ConfigModel,
        dialogs: Dialogs | None,
        key: str = LIST_PATH,
        host: TabHost | None = None,
    ) -> None:
        super().__init__(page, model, dialogs, key, host)
        self.editor = RowsEditor(
            self.scroll,
            model,
            dialogs,
            list_path=LIST_PATH,
            file_field=None,
            columns=EMBEDDING_COLUMNS,
            new_item=self.new_embedding,
            title="Additional embeddings",
            add_text="+ Add embedding",
            clone_item=clone_embedding,
        )
        self.editor.frame.grid(row=1, column=0, sticky="ew", padx=4, pady=(4, 8))

    def new_embedding(self) -> TrainEmbeddingConfig:
        taken = {e.placeholder for e in self.model.config.additional_embeddings or []}
        return TrainEmbeddingConfig(placeholder=unique_placeholder(taken))
