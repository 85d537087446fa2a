"""The main window: top bar (presets, config files, model type, method), generated tabs, and the run's footer.

The window edits one config (`ConfigModel`). Start checks a packed copy and hands it to a background thread
(`TrainingRunner`); events come back through a queue polled here with `after()`, on the Tk thread only.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import logging
import sys
import time
import tkinter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

import customtkinter as ctk

from gui import tk_finalizers
from gui.background import BackgroundResult, run_in_background
from gui.dialogs import JSON_FILES, Dialogs
from gui.footer import Footer
from gui.gallery import SampleGallery
from gui.log_view import EventLines, LogBuffer, LogHandler, LogWindow
from gui.model import CONTEXT_PATHS, ConfigModel, InputError
from gui.runner import TrainFunction, TrainingRunner
from gui.state import (
    DATA_FIELDS,
    list_user_presets,
    load_last_config,
    load_preset_data,
    preset_name_problem,
    save_last_config,
    save_preset_data,
    save_user_preset,
    user_preset_path,
)
from gui.tabs import visible_tabs
from gui.tabs.additional_embeddings import AdditionalEmbeddingsTab
from gui.tabs.cloud import CloudTab
from gui.tabs.concepts import ConceptsTab
from gui.tabs.form_tab import FormTab
from gui.tabs.sampling import SamplingTab, random_weights_note
from gui.tabs.tools import ToolsTab
from gui.tabs.training import TrainingTab
from gui.topbar import TopBar
from gui.widgets.estimate import attach_estimate
from gui.widgets.keys import bind_select_all
from gui.widgets.tabview import TabView
from gui.windows.closing_window import ClosingWindow
from gui.windows.queue_window import QueueWindow, open_queue_window
from onetrainer.config import (
    ConfigFileError,
    Problem,
    TrainConfig,
    errors,
    list_presets,
    load_config,
    load_layers,
    load_preset,
    pack,
    save_config,
    validate,
    warnings,
)
from onetrainer.config.naming import describe, field_name
from onetrainer.families import not_trainable_reason
from onetrainer.training.checks import hub_ids_to_ask, run_checks
from onetrainer.training.console import ConsoleSink
from onetrainer.training.events import Event, Failed, Finished, Progress, SampleReady, Started, Status
from onetrainer.training.job_queue import QUEUED, JobQueue, QueueEntry, QueueError, QueueRunnerLock, entry_config
from onetrainer.util.browser import open_in_browser

POLL_MS = 100
FINALIZE_MS = 500
VALIDATE_DELAY_MS = 250
AUTOSAVE_DELAY_MS = 1000
TENSORBOARD_POLL_MS = 250
TENSORBOARD_START_S = 30.0
QUEUE_REFRESH_MS = 5000  # the footer's queue count follows a terminal's changes to the queue file
QUEUE_NEXT_MS = 200  # between two runs of the queue: the window shows the first one's end
# The tabs are built in the Tk loop's spare time, a piece every BUILD_TABS_MS: a tab's own widgets, or this many of
# its fields (about 7 ms of the Tk thread each on a quiet machine, ten times that on a busy one). Input that arrives
# meanwhile waits for one piece at most, and a click on a tab finds it built.
BUILD_TABS_MS = 20
BUILD_TABS_VIEWS = 4
TENSORBOARD_STATUS = "TensorBoard: "  # how the trainer's Status event names the URL of the run's server
_MISSING = object()

TAB_CLASSES: dict[str, type[FormTab]] = {
    "concepts": ConceptsTab,
    "training": TrainingTab,
    "sampling": SamplingTab,
    "additional_embeddings": AdditionalEmbeddingsTab,
    "tools": ToolsTab,
    "cloud": CloudTab,
}


def summarize(problems: list[Problem], config: TrainConfig) -> str:
    """The footer's one line about a list of problems: the first, and how many more the Log window lists."""
    return describe(problems[0], config) + more_problems(problems) if problems else ""


def more_problems(problems: list[Problem]) -> str:
    """What the footer says after the first problem (kept whole when the line is shortened)."""
    return f" (and {len(problems) - 1} more; see Log)" if len(problems) > 1 else ""


def _count(n: int, plural: str) -> str:
    return f"{n} {plural if n != 1 else plural.removesuffix('s')}"


def listed(problems: list[Problem], config: TrainConfig) -> str:
    """Problems for a dialog or the Log: one per line, each marked, so two never read as one paragraph."""
    return "\n".join(f"• {describe(p, config)}" for p in problems)


def users_items(items: list, brought: list[dict] | None) -> list:
    """The items of a concepts or samples list that are the user's: all but one unedited copy of each item the last
    preset brought (an edited one differs from what it brought, so it is the user's now)."""
    left = list(brought or [])
    own = []
    for item in items:
        data = item.to_dict()
        if data in left:
            left.remove(data)
        else:
            own.append(item)
    return own


class App(ctk.CTk):
    def __init__(
        self,
        config: TrainConfig | None = None,
        *,
        train_function: TrainFunction | None = None,
        dialogs: Callable[[App], Dialogs] | None = None,
        autosave: bool = True,
        open_url: Callable[[str], object] = open_in_browser,
        presets: Callable[[], list[str]] = list_presets,
        user_presets: Callable[[], list[str]] = list_user_presets,
        limit_threads: bool = True,
        console: TextIO | None = None,
        tensorboard_server: Callable[[Path, int], Any] | None = None,
        queue_path: Path | None = None,
    ) -> None:
        tk_finalizers.install()
        super().__init__()
        self.title("OneTrainer")
        self.geometry("1280x800")
        self.minsize(1000, 620)
        bind_select_all(self)
        restore_problems: list[Problem] = []
        # The concepts and samples the last preset brought (as dicts): while unedited they are the preset's, not the
        # user's, and the next preset drops them without asking. Restored with the last config.
        self._preset_data: dict[str, list[dict] | None] = {}
        if config is None:
            config, restore_problems = load_last_config()
            if config is not None:
                self._preset_data = load_preset_data()
        self.model = ConfigModel(config or TrainConfig())
        self.dialogs = dialogs(self) if dialogs is not None else Dialogs(self)
        # Started from a terminal (start-ui.sh), the terminal shows the run's progress as `train.py` does.
        self.runner = TrainingRunner(
            train_function,
            limit_threads=limit_threads,
            extra_sinks=lambda: [ConsoleSink(console)] if console is not None else [],
        )
        # The Log window shows what the console shows: the run's events and warnings logged by any library.
        self.log = LogBuffer()
        self._event_lines = EventLines()
        self._log_handler = LogHandler(self.log)
        logging.getLogger().addHandler(self._log_handler)
        self.log_window: LogWindow | None = None
        self._tensorboard_factory = tensorboard_server or _default_tensorboard_server
        self.tensorboard: Any = None  # the server the TensorBoard button started (None: none yet)
        self._run_tensorboard_url: str | None = None  # the running trainer's own server
        self._run_note = ""  # said with each sample of the run (the demo's model draws noise)
        self._hub_question = None  # the background question to the hub that Start waits for (see _ask_hub_first)
        # The problems a refused start named, with their field's value then (to notice fixes).
        self._refused: list[tuple[Problem, Any]] | None = None
        self.autosave_enabled = autosave
        self._open_url = open_url
        self._after_ids: dict[str, str] = {}
        self._closing = False
        self.closing_window: ClosingWindow | None = None  # shown while the app waits for a run to stop before closing
        self._closing_since = 0.0
        self._run_step = 0  # the running run's last step (0: none trained yet)
        self._terminal_seen = False
        self._stale_context: set[str] = set()
        self._stale_values: set[str] = set()
        self.problems: list[Problem] = []
        self.tabs: dict[str, FormTab] = {}
        self.gallery = SampleGallery()  # the newest image of each sample, shown on the sampling tab
        # The queue of runs: its file is found when used (the app's folder then), its runner lock held while the app
        # runs the queue, and the entry being trained.
        self._queue_path = queue_path
        self.queue_window: QueueWindow | None = None
        self._queue_lock: QueueRunnerLock | None = None
        self._queue_entry: QueueEntry | None = None
        self._queue_stop = False
        self._queue_done: list[QueueEntry] = []  # the entries this Run queue has trained, as recorded

        self.grid_columnconfigure(0, weight=1)
        self.grid_rowconfigure(1, weight=1)
        self.topbar = TopBar(
            self,
            self.model,
            list_presets=presets,
            on_preset=self.load_preset,
            on_load=self.load_config_file,
            on_save=self.save_config_file,
            list_user_presets=user_presets,
            on_user_preset=lambda name: self.load_preset(name, user=True),
            on_save_preset=self.save_preset,
        )
        self.topbar.grid(row=0, column=0, sticky="ew")
        self.tabview = TabView(self, command=self._tab_selected, fg_color="transparent")
        self.tabview.grid(row=1, column=0, sticky="nsew", padx=6)
        self.footer = Footer(
            self,
            on_start=self.start,
            on_sample=self.sample_now,
            on_save=self.save_now,
            on_backup=self.backup_now,
            on_tensorboard=self.open_tensorboard,
            on_export=self.export_config,
            on_log=self.open_log,
            on_queue_add=self.add_to_queue,
            on_queue=self.open_queue,
        )
        self.footer.grid(row=2, column=0, sticky="ew")
        # peak VRAM and s/step beside Start; a click fits the run to a VRAM budget
        self.estimate = attach_estimate(self.footer, self.model, lambda: self.fit_to_vram())

        self.model.subscribe(self._config_changed)
        self.model.subscribe_inputs(self._input_changed)
        self._input_status: str | None = None  # the footer shows this input's error
        self.protocol("WM_DELETE_WINDOW", self.close)
        self._schedule("finalize", FINALIZE_MS, self._finalize_collected)
        self._show_tabs()
        if self.tabview.current is not None:
            self.tabs[self.tabview.current].form.finish()  # the first page opens whole; the others come in spare time
        self.validate_now()
        self._queue_tick()
        if restore_problems:
            self._log_problems("Last session's config:", restore_problems)
            # At start-up a note is enough: the fields with problems are marked, and a dialog would greet every launch.
            self.footer.set_status(
                f"Last session's config: {summarize(restore_problems, self.model.config)}", "warning"
            )

    # -- tabs ----------------------------------------------------------------------------------------------------

    def tab(self, key: str) -> FormTab:
        """The content of tab `key`: created on first use, its fields then created a few at a time in the Tk loop's
        spare time (`_build_tabs`); `select_tab` and `form.view` have them all at once."""
        tab = self.tabs.get(key) or self._create_tab(key)
        self._bring_up_to_date(key)
        if not tab.form.complete:
            self._schedule("build tabs", BUILD_TABS_MS, self._build_tabs)
        return tab

    def _create_tab(self, key: str) -> FormTab:
        tab = TAB_CLASSES.get(key, FormTab)(self.tabview.page(key), self.model, self.dialogs, key, self)
        self.tabs[key] = tab
        if isinstance(tab, SamplingTab):
            tab.set_running(self.footer.commands_enabled)
        tab.mark(self._problems_by_path())
        return tab

    def _build_tabs(self) -> None:
        """One piece of the tabs' building (the tab on screen first, then the others in their order): a tab's own
        widgets, or a few of its fields. Building a tab whole on its first click held every click and key back for
        as long (seconds on a busy machine) and showed a blank page meanwhile."""
        current = self.tabview.current
        for key in ([current] if current else []) + self.tabview.keys:
            tab = self.tabs.get(key)
            if tab is not None and tab.form.complete:
                continue
            started = time.perf_counter()
            if tab is None:
                self._create_tab(key)
            else:
                tab.form.build_some(BUILD_TABS_VIEWS)
            # At most half of the Tk thread's time: the estimate's worker and the trainer want the GIL too.
            took_ms = round((time.perf_counter() - started) * 1000)
            self._schedule("build tabs", max(BUILD_TABS_MS, took_ms), self._build_tabs)
            return

    def _bring_up_to_date(self, key: str) -> None:
        tab = self.tabs[key]
        if key not in self._stale_values and key not in self._stale_context:
            return
        if key in self._stale_values:
            self._stale_values.discard(key)
            tab.refresh()
        if key in self._stale_context:
            self._stale_context.discard(key)
            tab.update_context()
        tab.mark(self._problems_by_path())  # rebuilt rows and newly shown fields get their marks

    def _tab_selected(self, key: str) -> None:
        self.tab(key)

    def _show_tabs(self) -> None:
        self.tabview.set_tabs([(t.key, t.title) for t in visible_tabs(self.model.context())])
        if self.tabview.current is not None:
            self.tab(self.tabview.current)
        self._schedule("build tabs", BUILD_TABS_MS, self._build_tabs)  # a tab shown now for the first time

    def select_tab(self, key: str) -> FormTab:
        """Select tab `key` and return it with all its fields (as code asks for it; a click shows it at once)."""
        self.tabview.select(key)
        tab = self.tabs[key]
        tab.form.finish()
        return tab

    # -- config changes ------------------------------------------------------------------------------------------

    def _config_changed(self, path: str | None) -> None:
        if path is None:
            self._refused = None  # a replaced config is not the one whose start was refused
        if path is None or path == "workspace_dir":
            self.gallery.keep_workspace(self.model.config.workspace_dir)
        if path is None or path in CONTEXT_PATHS:
            # Tabs not on screen catch up when they are selected.
            self._stale_context = set(self.tabs)
            if path is None:
                self._stale_values = set(self.tabs)
            self.topbar.refresh()
            self._show_tabs()
        self._schedule("validate", VALIDATE_DELAY_MS, self.validate_now)
        if self.autosave_enabled:
            self._schedule("autosave", AUTOSAVE_DELAY_MS, self.autosave_now)

    def validate_now(self) -> list[Problem]:
        """Mark every field whose value validation finds wrong (cross-field rules included)."""
        self.problems = validate(self.model.config)
        self._mark(self.problems)
        self._recheck_refusal()
        return self.problems

    def _mark(self, problems: list[Problem]) -> None:
        self.problems = problems
        by_path = self._problems_by_path()
        self.model.set_marks(by_path)  # the forms of open windows
        for tab in self.tabs.values():
            tab.mark(by_path)

    def input_problems(self) -> list[Problem]:
        """The inputs (in any window) whose text the config did not take: the config holds their last valid value."""
        return [Problem(e.path, f"{e.message} (not applied)") for e in self.model.input_errors()]

    def _input_changed(self, error: InputError) -> None:
        # The form itself shows no message (a line appearing under a field would move the form): the footer does.
        if error.message:
            self._input_status = error.path
            self.footer.set_status(f"{field_name(self.model.config, error.path)}: {error.message}", "error")
        elif self._input_status == error.path:
            self._input_status = None
            others = self.model.input_errors()
            if others:
                self._input_changed(others[0])
            elif self._refused is not None:
                self._recheck_refusal()
            else:
                self.footer.set_status("Ready.")

    def _problems_by_path(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for problem in errors(self.problems):
            out.setdefault(problem.path, problem.message)
        return out

    def autosave_now(self) -> None:
        try:
            save_last_config(self.model.config)
            save_preset_data(self._preset_data)
        except OSError as e:
            self.footer.set_status(f"Could not remember the config for next time: {e}", "warning")

    # -- presets and config files --------------------------------------------------------------------------------

    def keep_changes(self, what: str) -> bool:
        """Before `what` replaces the config: offer to save unsaved changes. False when the user cancels."""
        if not self.model.unsaved:
            return True
        answer = self.dialogs.ask_save_changes(
            "Unsaved changes", f"The config has changes that are not saved in a file. Save them before {what}?"
        )
        if answer is None:
            return False
        return answer == "discard" or self.save_config_file() is not None

    def load_preset(self, name: str, user: bool = False) -> bool:
        """Load a preset's settings. The concepts and samples being edited stay unless the preset brings its own, and
        then the user is asked before they are replaced. Those the last preset brought and nobody edited are that
        preset's, not the user's: they go without asking, and the user's own stay beside them."""
        if self._refuse_while_running(f"load the preset '{name}'"):
            return False
        if not self.keep_changes(f"loading the preset '{name}'"):
            return False
        try:
            config, problems = load_preset(user_preset_path(name) if user else name)
        except ConfigFileError as e:
            self.dialogs.show_error("Cannot load the preset", str(e))
            return False
        current = self.model.config
        packed, _ = pack(current)
        # Per field: the user's items (None: the user's list is the side file), and whether the list held the last
        # preset's items only (then it goes back to the side file, the user's own list, as if never replaced).
        users: dict[str, list] = {}
        keep: dict[str, list | None] = {}
        for field in DATA_FIELDS:
            items = getattr(current, field)
            if items is None:
                users[field] = getattr(packed, field) or []
                keep[field] = None
                continue
            own = users_items(items, self._preset_data.get(field))
            users[field] = own
            keep[field] = None if items and not own else own
        clashing = [f for f in DATA_FIELDS if getattr(config, f) is not None and users[f]]
        replace = True
        if clashing:
            theirs = " and ".join(_count(len(getattr(config, f)), f) for f in clashing)
            yours = " and ".join(_count(len(users[f]), f) for f in clashing)
            choice = self.dialogs.ask_choice(
                "The preset brings its own data",
                f"The preset '{name}' brings its own {theirs}. Replace your {yours} with them?\n\n"
                "Keep mine loads only its settings and keeps yours; Cancel loads nothing.",
                [("Replace", "replace"), ("Keep mine", "keep"), ("Cancel", None)],
                None,
            )
            if choice is None:
                self.footer.set_status(f"The preset '{name}' was not loaded.")
                return False
            replace = choice == "replace"
        brought: dict[str, list[dict] | None] = {}
        for field in DATA_FIELDS:
            items = getattr(config, field)
            if items is not None and (replace or field not in clashing):
                brought[field] = [item.to_dict() for item in items]
                continue
            setattr(config, field, keep[field])
            brought[field] = None
        self.model.replace(config)
        self._refused = None
        self._preset_data = brought  # autosaved with the config (see autosave_now)
        self.footer.reset_progress()  # the last run's figures are not this config's (no run is active: see above)
        self.report_loaded(f"Preset '{name}' loaded.", problems)
        return True

    def _refuse_while_running(self, what: str) -> bool:
        """True (with a notice) while a run trains: replacing the config then would show settings that are not the
        running ones (the run goes on with a copy), so the window keeps showing what trains."""
        if not self.running:
            return False
        text = f"Cannot {what} while training runs: the window shows the running settings. Stop the run first."
        self.footer.set_status(text, "error")
        self.dialogs.show_error("Training is running", text)
        return True

    def save_preset(self, name: str | None = None) -> Path | None:
        """Save the current settings (not the concepts and samples) as one of the user's presets."""
        name = name if name is not None else self.dialogs.ask_string("Save as my preset", "Name of the preset:")
        if not name:
            return None
        problem = preset_name_problem(name)
        if problem:
            self.dialogs.show_error("Cannot save the preset", problem)
            return None
        invalid = self.input_problems() + errors(validate(self.model.config))
        if invalid:
            self._refuse(invalid, "save the preset")
            return None
        path = user_preset_path(name)
        if path.exists() and not self.dialogs.ask_yes_no("Replace the preset?", f"'{name}' exists. Replace it?"):
            return None
        try:
            save_user_preset(self.model.config, name)
        except OSError as e:
            self.dialogs.show_error("Cannot save the preset", str(e))
            return None
        self.footer.set_status(f"Preset '{name}' saved to {path}; it is under Load preset ▸ My presets.", "ok")
        return path

    def load_config_file(self, path: str | Path | None = None) -> bool:
        if self._refuse_while_running("load a config file"):
            return False
        if not self.keep_changes("loading another config"):
            return False
        path = path or self.dialogs.open_file("Load config", JSON_FILES)
        if not path:
            return False
        try:
            config, problems = load_config(path)
        except ConfigFileError as e:
            self.dialogs.show_error("Cannot load the config", str(e))
            return False
        self.model.replace(config)
        self._refused = None
        self._preset_data = {}
        self.footer.reset_progress()
        self.report_loaded(f"Config loaded from {path}.", problems)
        return True

    def report_loaded(self, text: str, problems: list[Problem]) -> None:
        config = self.model.config
        if problems:
            self._log_problems(text, problems)
        if errors(problems):
            count = len(errors(problems))
            needs = "needs" if count == 1 else "need"
            self.footer.set_status(f"{text} {_count(count, 'problems')} {needs} fixing (marked in red).", "warning")
            self.dialogs.show_text("Problems in the loaded config", listed(problems, config))
        elif problems:
            self.footer.set_status(f"{text} {summarize(problems, config)}", "warning")
        else:
            self.footer.set_status(text)

    def save_config_file(self, path: str | Path | None = None) -> Path | None:
        """Save the config; refused, with every invalid field listed, while a field holds an invalid value."""
        invalid = self.input_problems() + errors(validate(self.model.config))
        if invalid:
            self._refuse(invalid, "save the config")
            return None
        path = path or self.dialogs.save_file("Save config", ".json", JSON_FILES)
        if not path:
            return None
        try:
            save_config(self.model.config, path)
        except OSError as e:
            self.dialogs.show_error("Cannot save the config", str(e))
            return None
        self.model.mark_saved()
        self.footer.set_status(f"Config saved to {path}.")
        return Path(path)

    def export_config(self, path: str | Path | None = None) -> Path | None:
        """Write a packed config (concepts and samples inline) that `scripts/train.py --config-path` runs as is."""
        path = path or self.dialogs.save_file("Export config", ".json", JSON_FILES)
        if not path:
            return None
        packed, problems = pack(self.model.config)
        try:
            save_config(packed, path)
        except OSError as e:
            self.dialogs.show_error("Cannot export the config", str(e))
            return None
        if problems:
            self._log_problems(f"Config exported to {path}:", problems)
        notes = f" ({summarize(problems, self.model.config)})" if problems else ""
        self.footer.set_status(f"Config exported to {path}{notes}.", "warning" if problems else "info")
        return Path(path)

    # -- training ------------------------------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self.runner.is_alive() or self.footer.running

    def start(self, reattach: bool = False) -> bool:
        """Start (or, while running, stop). Refuses with every problem listed when the config cannot be trained.

        `reattach` (the cloud tab's Reattach now): the run only follows the host's run of `cloud.run_id`, never starts
        one (`cloud.attach_only` set in the copy handed to the trainer; the config itself is left as it is)."""
        if self.running:
            self.stop()
            return False
        if self.queue_running:  # between two of the queue's runs
            self.footer.set_status("The queue is running: its next run starts now (Stop queue stops it).", "warning")
            return False
        config = self.model.config
        reason = not_trainable_reason(config.model_type)
        if reason:
            self.footer.set_status(f"Cannot start: {reason}", "error")
            self.dialogs.show_error("Cannot start training", reason)
            return False
        # A start pauses the estimate: its measurement competes for the CPU (the window answers slowly) and holds the
        # model library the run's load needs. A refused start resumes it; a question to the hub keeps it paused.
        self.estimate.pause()
        if self._ask_hub_first(config):
            return False
        packed, _ = pack(config)  # run_checks reports problems reading the side files itself
        problems = run_checks(packed)
        self._mark(problems)
        typed = self.input_problems()  # text in a field that is no valid value: the config holds an older one
        if typed or errors(problems):
            self._refuse(typed + problems, "start")
            self.estimate.resume()
            return False
        if reattach:
            packed.cloud = {**(packed.cloud or {}), "attach_only": True}
        self._begin_run(packed)
        found = warnings(problems)
        if found:
            self.footer.set_status(f"Starting… ({len(found)} warning(s): {found[0].message})", "warning")
        else:
            self.footer.set_status("Starting…")
        return True

    def _begin_run(self, packed: TrainConfig) -> None:
        """Hand a checked, packed copy to the trainer thread (Start, and each run of the queue)."""
        self._terminal_seen = False
        self._run_step = 0
        # No full garbage collection here (there was one, to free destroyed widgets' Tk objects on this thread): with a
        # model library loaded it held the click 0.1-0.6 s, more on a busy machine, and the trainer thread's
        # collections hand those objects to this thread anyway (tk_finalizers).
        self.runner.start(packed)
        self._run_note = random_weights_note(packed.base_model_name)
        self._run_tensorboard_url = None
        self._refused = None
        self.footer.reset_progress()
        self._set_running(True)
        self._schedule("poll", POLL_MS, self._poll)

    def fit_to_vram(self, gib: float | None = None) -> bool:
        """The estimate's "fit to a VRAM budget": ask the budget (the free memory shown as the suggestion), find the
        changes on a worker thread (`training/fit.py`), then apply them as edits of the config (each undoable by
        editing it back); the log lists them. False when nothing was started."""
        if self.running:
            return False
        shown = self.estimate.result  # the estimate beside Start: the fit starts from it where it is of a GPU
        if gib is None:
            from onetrainer.training.estimate import size_text

            free = getattr(shown, "free_bytes", None)
            hint = f" ({size_text(free)} are free on this GPU now)" if free else ""
            answer = self.dialogs.ask_string("Fit to VRAM", f"Fit the run to how many GiB of GPU memory?{hint}")
            if not answer:
                return False
            try:
                gib = float(answer.lower().removesuffix("gib").removesuffix("gb").strip())
            except ValueError:
                gib = 0.0
            if gib <= 0:
                self.dialogs.show_error("Fit to VRAM", f"'{answer}' is not a size in GiB (for example 8 or 11.5)")
                return False
        packed, _ = pack(self.model.config)
        device = packed.train_device
        first = shown if shown is not None and shown.device == "cuda" and not self.estimate.busy else None
        self.footer.set_status(f"Fitting the run to {gib:g} GiB…")

        def work():
            from onetrainer.training.estimate import device_throughput
            from onetrainer.training.fit import GIB, fit_to_budget, machine_gpus

            gpus = machine_gpus(device)
            return fit_to_budget(packed, gib * GIB, device_throughput(device), first=first, gpus=gpus)

        run_in_background(self, work, self._fitted)
        return True

    def _fitted(self, result: BackgroundResult) -> None:
        if result.error is not None:
            self.footer.set_status(f"Cannot fit the run: {result.error}", "error")
            return
        fit = result.value
        self.log.add(f"Fit to VRAM: {fit.text()}")
        if self.estimate.result is not None and self.estimate.result.device != "cuda":
            self.log.add("  (sized for a CUDA GPU: this machine has none; the estimate beside Start is of its RAM)")
        if not fit.fits:
            self.footer.set_status(f"{fit.headline}: nothing changed (the list is in the log)", "warning")
            return
        for change in fit.changes:
            self.model.set(change.path, change.json_value)
        summary = "; ".join(f"{c.path} {c.json_value}" for c in fit.changes)
        self.footer.set_status(fit.headline + (f": {summary}" if summary else ""))

    def _ask_hub_first(self, config: TrainConfig) -> bool:
        """The checks ask the hub about hub model ids, which can take seconds on a bad connection: ask on a worker
        thread first and start again with the answers remembered. True while the question is out."""
        to_ask = hub_ids_to_ask(config)
        if not to_ask:
            return False
        if self._hub_question is None:
            from onetrainer.util.hub import probe

            self.footer.set_status(f"Checking the model on the Hugging Face hub ({', '.join(to_ask)})…")
            self._hub_question = run_in_background(self, lambda: [probe(i) for i in to_ask], self._hub_answered)
        return True

    def _hub_answered(self, result: BackgroundResult) -> None:
        self._hub_question = None
        if result.error is not None:
            self.footer.set_status(f"Cannot start: asking the hub failed: {result.error}", "error")
            self.estimate.resume()
            return
        if not self.running:
            self.start()

    def _log_problems(self, heading: str, problems: list[Problem]) -> None:
        """The whole list in the Log window (the footer's one line names the first and points there)."""
        self.log.add(heading)
        self.log.add(listed(problems, self.model.config))

    def _refuse(self, problems: list[Problem], what: str) -> None:
        config = self.model.config
        errs = errors(problems)
        if what == "start":
            self._refused = [(p, _value_at(config, p.path)) for p in errs]
        ordered = errs + warnings(problems)
        self._log_problems(f"Cannot {what}:", ordered)
        first = describe(errs[0], config) if errs else ""
        self.footer.set_status(f"Cannot {what}, {_count(len(errs), 'problems')}: {first}", "error", more_problems(errs))
        title = "Cannot start training" if what == "start" else f"Cannot {what}"
        head = "Fix this problem first:" if len(errs) == 1 else f"Fix these {len(errs)} problems first:"
        self.dialogs.show_error(title, f"{head}\n\n{listed(ordered, config)}")

    def _recheck_refusal(self) -> None:
        """A refused start's message follows the fixes: fewer problems, then none. Validation's problems are known
        at once; a check that looks at the disk (a folder, a model file) counts as open until its field changed, and
        then the checks run again: only when they pass does the line say that Start can go."""
        if self._refused is None:
            return
        if self.running:
            self._refused = None
            return
        config = self.model.config
        remaining = self.input_problems() + errors(self.problems)
        paths = {p.path for p in remaining}
        for problem, value in self._refused:
            if problem.path not in paths and _value_at(config, problem.path) == value:
                remaining.append(problem)
                paths.add(problem.path)
        if remaining and paths == {problem.path for problem, _ in self._refused}:
            return  # the same problems (a revalidation that only caught up): the refusal's own line stays
        if not remaining:
            rechecked = self._run_checks_again(config)
            if rechecked is None:
                return
            self._refused = [(p, _value_at(config, p.path)) for p in rechecked]
            remaining = rechecked
        if remaining:
            self.footer.set_status(
                f"Cannot start, {_count(len(remaining), 'problems')} left: {describe(remaining[0], config)}",
                "error",
                more_problems(remaining),
            )
        else:
            self._refused = None
            self.footer.set_status("Checked again: the problems that stopped the start are fixed. Start can go.", "ok")

    def _run_checks_again(self, config: TrainConfig) -> list[Problem] | None:
        """Start's checks on the fixed config (their errors; [] when it passes). None when they need the hub's
        answer first (seconds on a bad connection: Start asks on a worker thread), said on the status line."""
        if hub_ids_to_ask(config):
            self._refused = None
            self.footer.set_status("The fields that stopped the start changed: Start checks them again.", "info")
            return None
        packed, _ = pack(config)
        problems = run_checks(packed)
        self._mark(problems)  # a field the checks still find wrong is marked again
        return errors(problems)

    def stop(self) -> None:
        if self.runner.is_alive():
            self.runner.request_stop()
            self.footer.set_stopping()
            self._commands_follow()

    def sample_now(self) -> None:
        if self._command_refused("Sampling now"):
            return
        self.runner.request_sample()
        self.footer.set_status("A sample will be made at the next step.")

    def save_now(self) -> None:
        if self._command_refused("Saving now"):
            return
        self.runner.request_save()
        self.footer.set_status("The model will be saved at the next step.")

    def backup_now(self) -> None:
        if self._command_refused("A backup now"):
            return
        self.runner.request_backup()
        self.footer.set_status("A backup will be written at the next step.")

    def _command_refused(self, what: str) -> bool:
        """True (said on the status line) when the trainer would not take a command now: it takes them at a step."""
        if self.footer.commands_enabled and self.runner.is_alive():
            return False
        if not self.runner.is_alive():
            self.footer.set_status(f"{what} needs a running training: start it first.", "warning")
        elif self.footer.stopping:
            self.footer.set_status(f"{what} is not possible: the run is stopping.", "warning")
        else:
            self.footer.set_status(f"{what} waits for the first step: the run is still loading or caching.", "warning")
        return True

    def _commands_follow(self) -> None:
        """The sampling tab's Sample now follows the footer's."""
        sampling = self.tabs.get("sampling")
        if isinstance(sampling, SamplingTab):
            sampling.set_running(self.footer.commands_enabled)

    def open_tensorboard(self) -> str | None:
        """Open TensorBoard in the browser: the running trainer's server, else one this button started on the
        workspace's event files (started now when none runs; the browser opens once it serves)."""
        if self.running and self._run_tensorboard_url:
            return self._open_in_browser(self._run_tensorboard_url)
        server = self.tensorboard
        if server is not None and server.running:
            return self._open_in_browser(server.url)
        log_dir = Path(self.model.config.workspace_dir) / "tensorboard"
        server = self._tensorboard_factory(log_dir, self.model.config.tensorboard_port)
        try:
            server.start()
        except (OSError, RuntimeError) as e:
            self.footer.set_status(f"TensorBoard could not start: {e}", "error")
            return None
        self.tensorboard = server
        self.footer.set_status(f"Starting TensorBoard on {log_dir}…")
        self._wait_for_tensorboard(server, time.monotonic() + TENSORBOARD_START_S)
        return server.url

    def _wait_for_tensorboard(self, server: Any, deadline: float) -> None:
        if server is not self.tensorboard:
            return
        if server.wait_until_serving(0.05):
            self._open_in_browser(server.url)
        elif not server.running:
            self.footer.set_status("TensorBoard could not start (is the tensorboard package installed?).", "error")
        elif time.monotonic() > deadline:
            self.footer.set_status(f"TensorBoard did not answer at {server.url} within 30 s.", "error")
        else:
            self._schedule("tensorboard", TENSORBOARD_POLL_MS, lambda: self._wait_for_tensorboard(server, deadline))

    def _open_in_browser(self, url: str) -> str:
        try:
            opened = bool(self._open_url(url))
        except Exception as e:  # webbrowser raises webbrowser.Error, or OSError from a broken launcher
            opened = False
            self.log.add(f"opening a browser failed: {e}")
        if opened:
            self.footer.set_status(f"TensorBoard: opened {url} in the browser.")
        else:
            self.footer.set_status(
                f"TensorBoard runs at {url}, but no web browser could be opened: open it yourself.", "error"
            )
        return url

    def open_log(self) -> LogWindow:
        if self.log_window is not None and self.log_window.winfo_exists():
            self.log_window.lift()
            return self.log_window
        self.log_window = LogWindow(self, self.log)
        return self.log_window

    def _poll(self) -> None:
        for event in self.runner.drain():
            self._handle(event)
        if self.runner.is_alive():
            self._schedule("poll", POLL_MS, self._poll)
            return
        for event in self.runner.drain():
            self._handle(event)
        if not self._terminal_seen:
            self._handle(self.runner.outcome or Failed("the training thread ended without a result"))
        self._set_running(False)
        if self._queue_entry is not None:  # a run of the queue ended: record it, then the next one
            entry, self._queue_entry = self._queue_entry, None
            self._queue_record(entry, self.runner.outcome or Failed("the training thread ended without a result"))
            control = self.runner.control
            if control is not None and (control.stop_requested or control.abort_requested):
                self._queue_stop = True  # Stop stops the queue too: the entries left stay queued
            self._schedule("queue next", QUEUE_NEXT_MS, self._next_in_queue)

    def _set_running(self, running: bool) -> None:
        self.footer.set_running(running)
        if not running:
            self.estimate.resume()
        self._commands_follow()

    def _handle(self, event: Event) -> None:
        self.footer.on_event(event)
        if isinstance(event, Started):
            self._commands_follow()
        elif isinstance(event, Progress):
            self._run_step = event.global_step
        if isinstance(event, SampleReady) and self._run_note:
            self.footer.set_status(f"{self.footer.status} ({self._run_note})")
        line = self._event_lines.line(event)
        if line is not None:
            self.log.add(line)
        if isinstance(event, Status) and event.text.startswith(TENSORBOARD_STATUS):
            self._run_tensorboard_url = event.text[len(TENSORBOARD_STATUS) :].split()[0]
        if isinstance(event, SampleReady):
            self.gallery.add(event)
        if isinstance(event, Finished | Failed):
            self._terminal_seen = True
        if isinstance(event, Failed) and not self._closing and self._queue_entry is None:
            # A queue's failures go to the status line, the Log and the queue window: no dialog waits overnight.
            details = [event.message]
            if event.log_path:
                details.append(f"Log: {event.log_path}")
            if event.traceback:
                details.append(event.traceback)
            self.dialogs.show_error(event.headline, "\n\n".join(details))

    # -- the queue of runs ---------------------------------------------------------------------------------------

    @property
    def job_queue(self) -> JobQueue:
        return JobQueue(self._queue_path)

    @property
    def queue_running(self) -> bool:
        return self._queue_lock is not None

    def add_to_queue(self) -> QueueEntry | None:
        """Queue a copy of the config being edited, checked as Start checks it (refused with every problem listed)."""
        config = self.model.config
        reason = not_trainable_reason(config.model_type)
        if reason:
            self.footer.set_status(f"Cannot queue: {reason}", "error")
            return None
        packed, _ = pack(config)
        problems = run_checks(packed)
        self._mark(problems)
        typed = self.input_problems()
        if typed or errors(problems):
            self._refuse(typed + problems, "queue")
            return None
        try:
            entry = self.job_queue.add(packed, source="app")
            waiting = len(self.job_queue.waiting())
        except QueueError as e:
            self.footer.set_status(f"Cannot queue: {e}", "error")
            return None
        self.queue_changed()
        self.log.add(f"Queued: {entry.name} ({entry.id})")
        self.footer.set_status(
            f"Added to the queue: {entry.name} ({waiting} waiting). Queue shows them; Run queue trains them.", "ok"
        )
        return entry

    def open_queue(self) -> QueueWindow:
        self.queue_window = open_queue_window(self)
        return self.queue_window

    def run_queue(self) -> bool:
        """Train the queued entries one after another in this window (as `job_queue.py run` does in a terminal)."""
        if self.queue_running:
            return False
        if self.running:
            self.footer.set_status("A run is going: Run queue can start once it has ended.", "warning")
            return False
        try:
            self._queue_lock = QueueRunnerLock.acquire(self.job_queue)
        except QueueError as e:
            self.footer.set_status(f"Cannot run the queue: {e}", "error")
            self.log.add(f"Cannot run the queue: {e}")
            return False
        self._queue_stop = False
        self._queue_done = []
        self._next_in_queue()
        return True

    def stop_queue(self) -> None:
        """Stop the queue: the current run stops as Stop stops it, the entries left stay queued."""
        self._queue_stop = True
        if self.runner.is_alive():
            self.stop()
        elif self._queue_entry is None:
            self._end_queue()

    def _next_in_queue(self) -> None:
        if not self.queue_running:
            return
        if self._closing or self._queue_stop:
            self._end_queue()
            return
        if self.running:  # the last run's end is still being shown
            self._schedule("queue next", QUEUE_NEXT_MS, self._next_in_queue)
            return
        try:
            entry = self.job_queue.claim_next()
        except QueueError as e:
            self.footer.set_status(f"The queue stopped: {e}", "error")
            self._end_queue(summary=False)
            return
        if entry is None:
            self._end_queue()
            return
        config = entry_config(entry)
        if isinstance(config, Failed):
            self._queue_record(entry, config)
            self._schedule("queue next", QUEUE_NEXT_MS, self._next_in_queue)
            return
        self.estimate.pause()
        self._queue_entry = entry
        self._begin_run(config)
        waiting = len(self.job_queue.waiting())
        self.footer.set_status(f"Queue: training {entry.name} ({waiting} waiting after it)…")
        self.log.add(f"Queue: {entry.name} ({entry.id}) starts")
        self.queue_changed()

    def _queue_record(self, entry: QueueEntry, outcome: Finished | Failed) -> None:
        try:
            recorded = self.job_queue.record(entry.id, outcome) or entry
        except QueueError as e:
            self.log.add(f"the queue could not record {entry.name}: {e}")
            recorded = entry
        self._queue_done.append(recorded)
        self.log.add(
            f"Queue: {recorded.name}: {recorded.status}" + (f" ({recorded.reason})" if recorded.reason else "")
        )
        self.queue_changed()

    def _end_queue(self, summary: bool = True) -> None:
        if self._queue_lock is not None:
            self._queue_lock.release()
            self._queue_lock = None
        if summary:
            failed = [e for e in self._queue_done if e.status == "failed"]
            try:
                waiting = len(self.job_queue.waiting())
            except QueueError:
                waiting = 0
            text = f"Queue: {len(self._queue_done)} run(s), {len(failed)} failed; {waiting} waiting"
            if self._queue_stop and waiting:
                text += " (stopped: Run queue goes on with them)"
            if failed:
                text += f". Failed: {failed[0].name}: {failed[0].reason.strip().splitlines()[0]}"
            self.footer.set_status(text, "error" if failed else "ok")
            self.log.add(text)
        self.queue_changed()

    def queue_changed(self) -> None:
        """The footer's queue count and the queue window follow a change of the queue."""
        try:
            entries = self.job_queue.entries()
        except QueueError:
            self.footer.set_queue("Queue: unreadable")
            entries = None
        if entries is not None:
            waiting = sum(1 for e in entries if e.status == QUEUED)
            if self.queue_running:
                self.footer.set_queue(f"Queue: running, {waiting} waiting")
            elif entries:
                self.footer.set_queue(f"Queue: {waiting} waiting")
            else:
                self.footer.set_queue("Queue: empty")
        window = self.queue_window
        if window is not None and window.winfo_exists():
            window.refresh()

    def _queue_tick(self) -> None:
        self.queue_changed()
        self._schedule("queue", QUEUE_REFRESH_MS, self._queue_tick)

    # -- closing -------------------------------------------------------------------------------------------------

    def close(self) -> None:
        """The window's close button. While training, first the run (stopping it, and what a stop saves), then unsaved
        settings; the window then stays, showing the run finishing, until it has ended (`ClosingWindow`)."""
        if self._closing:
            if self.closing_window is not None:
                self.closing_window.lift()
            return
        running = self.runner.is_alive()
        if running and not self.dialogs.ask_yes_no("Quit while training?", self._quit_question()):
            return
        if not self.keep_changes("quitting"):
            return
        self._closing = True
        if not running or not self.runner.is_alive():
            self._shutdown()
            return
        self.stop()
        self.closing_window = ClosingWindow(self, self._what_a_stop_saves(), self._shutdown)
        self._closing_since = time.monotonic()
        self._wait_then_close()

    def _quit_question(self) -> str:
        if self._run_step:
            state = f"Training is running (step {self._run_step} of {self.footer.totals[0]})"
        else:
            state = "Training is starting (loading the model or filling the cache)"
        return f"{state}. Stop it and quit?\n\n{self._what_a_stop_saves()}"

    def _what_a_stop_saves(self) -> str:
        """What the run writes when it stops now: a run that trained a step saves its model, others nothing."""
        config = self.runner.config
        if not self._run_step or config is None:
            return "No step has been trained yet: no model is saved (what is cached stays for the next run)."
        backup = ", after a backup," if config.backup_before_save else ""
        return (
            f"The model trained so far is saved to {config.output_model_destination}{backup} before the app closes; "
            "that can take a while."
        )

    def _wait_then_close(self) -> None:
        # The window stays, painting, until the run has ended: the process ending sooner would end the run's save.
        if self.runner.is_alive():
            if self.closing_window is not None and self.closing_window.winfo_exists():
                self.closing_window.show(self.footer.status, time.monotonic() - self._closing_since)
            self._schedule("close", POLL_MS, self._wait_then_close)
            return
        self._shutdown()

    def _shutdown(self) -> None:
        if self.autosave_enabled:
            self.autosave_now()
        self.destroy()

    def destroy(self) -> None:
        logging.getLogger().removeHandler(self._log_handler)
        if self._queue_entry is not None and not self.runner.is_alive():  # closed before the poll recorded its end
            self._queue_record(self._queue_entry, self.runner.outcome or Failed("the app closed during the run"))
            self._queue_entry = None
        if self._queue_lock is not None:  # an entry still running is queued again by the next reader of the queue
            self._queue_lock.release()
            self._queue_lock = None
        if self.tensorboard is not None:
            self.tensorboard.stop()
            self.tensorboard = None
        # Every pending `after` of this interpreter, customtkinter's and the widgets' too: left pending, each ran into
        # a destroyed widget and Tcl printed "invalid command name …" (a second window in the process heard them).
        # Cancelled in Tcl only: each widget deletes its own callback's command when it is destroyed.
        for after_id in self.tk.splitlist(self.tk.call("after", "info")):
            with contextlib.suppress(tkinter.TclError):
                self.tk.call("after", "cancel", after_id)
        self._after_ids.clear()
        super().destroy()
        tk_finalizers.drain()

    def _finalize_collected(self) -> None:
        """Free the Tk objects other threads' garbage collection left to this thread (`gui/tk_finalizers.py`)."""
        tk_finalizers.drain()
        self._schedule("finalize", FINALIZE_MS, self._finalize_collected)

    def _schedule(self, name: str, delay_ms: int, callback: Callable[[], None]) -> None:
        """Run `callback` once after `delay_ms`; scheduling the same name again replaces the pending call."""
        pending = self._after_ids.pop(name, None)
        if pending is not None:
            self.after_cancel(pending)

        def run() -> None:
            self._after_ids.pop(name, None)
            callback()

        self._after_ids[name] = self.after(delay_ms, run)


def _default_tensorboard_server(log_dir: Path, port: int) -> Any:
    from onetrainer.training.tensorboard import TensorBoardServer

    return TensorBoardServer(log_dir, port)


def _value_at(config: TrainConfig, path: str) -> Any:
    """A copy of the value at `path` (to notice later whether it changed); a marker when there is none."""
    value: Any = config
    for part in path.split(".") if path else []:
        if isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        elif isinstance(value, dict) and part in value:
            value = value[part]
        elif not isinstance(value, list | dict) and hasattr(value, part):
            value = getattr(value, part)  # never get_path: it creates missing nodes and list items
        else:
            return _MISSING
    return copy.deepcopy(value) if path else _MISSING


def build_parser(prog: str = "train_ui.py") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description="Open the OneTrainer app.")
    parser.add_argument("--preset", metavar="NAME_OR_FILE", help="start from this preset instead of the last config")
    parser.add_argument("--config-path", metavar="FILE", help="start from this config (over the preset, if given)")
    parser.add_argument("--appearance", choices=("dark", "light", "system"), default="dark", help="colour scheme")
    return parser


def main(argv: Sequence[str] | None = None, prog: str = "train_ui.py") -> int:
    args = build_parser(prog).parse_args(argv)
    from onetrainer.cli import register_model_sources

    register_model_sources()  # the demo preset names `tiny:` models: the checks, the estimate and the run resolve them
    config: TrainConfig | None = None
    problems: list[Problem] = []
    if args.preset or args.config_path:
        try:
            config, problems = load_layers(args.preset, args.config_path)
        except ConfigFileError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    ctk.set_appearance_mode(args.appearance)
    ctk.set_default_color_theme("blue")
    try:
        # The terminal it was started from (or the file its output is redirected to) shows the run's progress and
        # its outcome too, a failure with its log's path included (as `train.py` does).
        app = App(config, console=sys.stderr)
    except tkinter.TclError as e:
        print(f"error: cannot open a window ({e}); is a display available (DISPLAY)?", file=sys.stderr)
        return 1
    if problems:
        app.report_loaded("Config loaded.", problems)
    app.mainloop()
    return 0
