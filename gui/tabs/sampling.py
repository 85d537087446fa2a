"""The sampling tab: the sampling settings, a row per sample prompt, and the latest sample images."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gui.tabs.form_tab import TabHost
from gui.tabs.rows import RowAction, RowColumn, RowsEditor, RowsFormTab
from gui.widgets.gallery_view import GalleryView
from gui.windows.sample_editor import SampleEditorWindow
from onetrainer.config import SampleConfig
from onetrainer.config.model_types import MODEL_TYPES
from onetrainer.config.resolution import sample_size

if TYPE_CHECKING:
    from gui.dialogs import Dialogs
    from gui.model import ConfigModel

SAMPLE_COLUMNS = (
    RowColumn("enabled", "Enabled"),
    RowColumn("prompt", "Prompt", stretch=True),
    RowColumn("width", "Width"),
    RowColumn("height", "Height"),
    RowColumn("seed", "Seed"),
)


def random_weights_note(base_model_name: str) -> str:
    """What to expect of the samples of a model a named-model source stands for (the demo's `tiny:` models:
    noise, not a picture of the prompt); "" for any other model."""
    from onetrainer.families.sources import sample_note

    return sample_note(base_model_name)


def new_sample(model: ConfigModel) -> SampleConfig:
    """A sample at the training resolution (`resolution.sample_size`: the largest of several) with the model type's
    own steps, guidance and sampler; at the model type's sample size while the resolution is no valid one."""
    sample = SampleConfig()
    info = MODEL_TYPES.get(model.config.model_type)
    if info is not None:
        defaults = info.sample
        sample.width, sample.height = defaults.width, defaults.height
        sample.diffusion_steps, sample.cfg_scale = defaults.diffusion_steps, defaults.cfg_scale
        sample.noise_scheduler = defaults.noise_scheduler
    step = info.family.sample_step if info is not None else 8
    size = sample_size(model.config.resolution, step)
    if size is not None:
        sample.width, sample.height = size
    return sample


class SamplingTab(RowsFormTab):
    def __init__(
        self, page: Any, model: ConfigModel, dialogs: Dialogs | None, key: str = "sampling", host: TabHost | None = None
    ) -> None:
        super().__init__(page, model, dialogs, key, host)
        self.editor_window: SampleEditorWindow | None = None
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
            actions=[RowAction("…", "All of this sample's settings", self.open_editor)],
            clone_item=lambda sample: sample.copy(),
        )
        self.editor.frame.grid(row=1, column=0, sticky="ew", padx=4, pady=(4, 8))
        self.gallery: GalleryView | None = None
        if host is not None:
            self.gallery = GalleryView(
                self.scroll,
                host.gallery,
                lambda: model.config.workspace_dir,
                sample_now=host.sample_now,
                note=lambda: random_weights_note(model.config.base_model_name),
            )
            self.gallery.frame.grid(row=2, column=0, sticky="ew", padx=4, pady=(0, 8))
            model.subscribe(self._config_changed)

    def _config_changed(self, path: str | None) -> None:
        if self.gallery is not None and path in (None, "base_model_name"):
            self.gallery.show_note()

    def set_running(self, running: bool) -> None:
        """ "Sample now" asks the running trainer: without one there is nothing to ask."""
        if self.gallery is not None:
            self.gallery.sample_now_button.configure(state="normal" if running else "disabled")

    def open_editor(self, index: int) -> SampleEditorWindow:
        if self.editor_window is not None and self.editor_window.winfo_exists():
            self.editor_window.close()
        self.editor_window = SampleEditorWindow(self.page, self.model, self.dialogs, index)
        return self.editor_window
