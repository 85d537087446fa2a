"""The training tab: the generated form, with "…" dialogs beside the optimizer, the LR scheduler and the timesteps.

Choosing another optimizer keeps the settings of the one left and brings back the last settings of the new one
(`optim.switch_optimizer`), as OneTrainer does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gui.tabs.form_tab import FormTab, TabHost
from gui.windows.optimizer_dialog import OptimizerDialog
from gui.windows.scheduler_dialog import SchedulerDialog
from gui.windows.timestep_window import TimestepWindow

if TYPE_CHECKING:
    from gui.dialogs import Dialogs
    from gui.model import ConfigModel

OPTIMIZER_PATH = "optimizer.optimizer"
SCHEDULER_PATH = "learning_rate_scheduler"
TIMESTEP_PATH = "timestep_distribution"


class TrainingTab(FormTab):
    def __init__(
        self, page: Any, model: ConfigModel, dialogs: Dialogs | None, key: str = "training", host: TabHost | None = None
    ) -> None:
        super().__init__(page, model, dialogs, key, host)
        self.optimizer_dialog: OptimizerDialog | None = None
        self.scheduler_dialog: SchedulerDialog | None = None
        self.timestep_window: TimestepWindow | None = None
        self._optimizer = model.config.optimizer.optimizer
        attach = self.form.attach_button
        attach(OPTIMIZER_PATH, "…", self.open_optimizer_dialog, "This optimizer's parameters")
        attach(SCHEDULER_PATH, "…", self.open_scheduler_dialog, "A custom scheduler's class and arguments")
        attach(TIMESTEP_PATH, "…", self.open_timestep_window, "Preview the timestep distribution")
        model.subscribe(self._config_changed)

    def _config_changed(self, path: str | None) -> None:
        config = self.model.config
        chosen = config.optimizer.optimizer
        if path == OPTIMIZER_PATH and chosen is not self._optimizer:
            from onetrainer.training import optim

            # The menu already wrote the new optimizer; the block still holds the old one's settings.
            config.optimizer.optimizer = self._optimizer
            optim.switch_optimizer(config, chosen)
            self._optimizer = chosen
            self.model.changed("optimizer")
        else:
            self._optimizer = chosen

    def open_optimizer_dialog(self) -> OptimizerDialog:
        self.optimizer_dialog = _reopen(self.optimizer_dialog, lambda: OptimizerDialog(self.page, self.model))
        return self.optimizer_dialog

    def open_scheduler_dialog(self) -> SchedulerDialog:
        self.scheduler_dialog = _reopen(
            self.scheduler_dialog, lambda: SchedulerDialog(self.page, self.model, self.dialogs)
        )
        return self.scheduler_dialog

    def open_timestep_window(self) -> TimestepWindow:
        self.timestep_window = _reopen(
            self.timestep_window, lambda: TimestepWindow(self.page, self.model, self.dialogs)
        )
        return self.timestep_window


def _reopen(window: Any, create: Any) -> Any:
    """The open window brought to the front, or a new one."""
    if window is not None and window.winfo_exists():
        window.lift()
        window.focus()
        return window
    return create()
