"""The sampling tab: the sampling settings, and a row per sample prompt (enabled, size, seed, prompt)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gui.tabs.form_tab import FormTab
from gui.tabs.rows import RowColumn, RowsEditor
from onetrainer.config import SampleConfig
from onetrainer.config.model_types import MODEL_TYPES

if TYPE_CHECKING:
    from gui.dialogs import Dialogs
    from gui.model import ConfigModel

SAMPLE_COLUMNS = (
    RowColumn("enabled", "Enabled"),
    RowColumn("width", "Width"),
    RowColumn("height", "Height"),
    RowColumn("seed", "Seed"),
    RowColumn("prompt", "Prompt", stretch=True),
)


def new_sample(model: ConfigModel) -> SampleConfig:
    """A sample with the model type's own defaults (size, steps, guidance, sampler)."""
    sample = SampleConfig()
    info = MODEL_TYPES.get(model.config.model_type)
    if info is not None:
        defaults = info.sample
        sample.width, sample.height = defaults.width, defaults.height
        sample.diffusion_steps, sample.cfg_scale = defaults.diffusion_steps, defaults.cfg_scale
        sample.noise_scheduler = defaults.noise_scheduler
    return sample


class SamplingTab(FormTab):
    def __init__(self, page: Any, model: ConfigModel, dialogs: Dialogs | None, key: str = "sampling") -> None:
        super().__init__(page, model, dialogs, key)
        self.editor = RowsEditor(
            self.scroll,
            model,
            dialogs,
            list_path="samples",
            file_field="sample_definition_file_name",
            columns=SAMPLE_COLUMNS,
            new_item=lambda: new_sample(model),
            title="Samples",
            add_text="+ Add sample",
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
