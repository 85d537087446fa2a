"""The main window: top bar (presets, config files, model type, method), generated tabs, and the run's footer.

The window edits one config (`ConfigModel`). Start checks a packed copy and hands it to a background thread
(`TrainingRunner`); events come back through a queue polled here with `after()`, on the Tk thread only.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import sys
import time
import tkinter
import webbrowser
from collections.abc import Callable, Sequence
from pathlib import Path

import customtkinter as ctk

from gui.dialogs import JSON_FILES, Dialogs
from gui.footer import Footer
from gui.gallery import SampleGallery
from gui.model import CONTEXT_PATHS, ConfigModel
from gui.runner import TrainFunction, TrainingRunner
from gui.state import load_last_config, save_last_config
from gui.tabs import visible_tabs
from gui.tabs.additional_embeddings import AdditionalEmbeddingsTab
from gui.tabs.concepts import ConceptsTab
from gui.tabs.form_tab import FormTab
from gui.tabs.sampling import SamplingTab
from gui.tabs.tools import ToolsTab
from gui.tabs.training import TrainingTab
from gui.topbar import TopBar
from gui.widgets.estimate import attach_estimate
from gui.widgets.tabview import TabView
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
from onetrainer.config.checks import run_checks
from onetrainer.families import not_trainable_reason
from onetrainer.training.events import Event, Failed, Finished, SampleReady

POLL_MS = 100
VALIDATE_DELAY_MS = 250
AUTOSAVE_DELAY_MS = 1000
CLOSE_TIMEOUT_S = 30.0
FOOTER_PROBLEMS = 3  # problems listed in the footer; the dialog lists all

TAB_CLASSES: dict[str, type[FormTab]] = {
    "concepts": ConceptsTab,
    "training": TrainingTab,
    "sampling": SamplingTab,
    "additional_embeddings": AdditionalEmbeddingsTab,
    "tools": ToolsTab,
}


def summarize(problems: list[Problem], limit: int = FOOTER_PROBLEMS) -> str:
    """A footer-sized list of problems: the first few, and how many more the dialog shows."""
    listed = "; ".join(str(p) for p in problems[:limit])
    more = f"; and {len(problems) - limit} more (see the list)" if len(problems) > limit else ""
    return listed + more


class App(ctk.CTk):
    def __init__(
        self,
        config: TrainConfig | None = None,
        *,
        train_function: TrainFunction | None = None,
        dialogs: Callable[[App], Dialogs] | None = None,
        autosave: bool = True,
        open_url: Callable[[str], object] = webbrowser.open,
        presets: Callable[[], list[str]] = list_presets,
        limit_threads: bool = True,
    ) -> None:
        super().__init__()
        self.title("OneTrainer")
        self.geometry("1280x800")
        self.minsize(1000, 620)
        restore_problems: list[Problem] = []
        if config is None:
            config, restore_problems = load_last_config()
        self.model = ConfigModel(config or TrainConfig())
        self.dialogs = dialogs(self) if dialogs is not None else Dialogs(self)
        self.runner = TrainingRunner(train_function, limit_threads=limit_threads)
        self.autosave_enabled = autosave
        self._open_url = open_url
        self._after_ids: dict[str, str] = {}
        self._closing = False
        self._close_deadline = 0.0
        self._terminal_seen = False
        self._stale_context: set[str] = set()
        self._stale_values: set[str] = set()
        self.problems: list[Problem] = []
        self.tabs: dict[str, FormTab] = {}
        self.gallery = SampleGallery()  # the newest image of each sample, shown on the sampling tab

        self.grid_columnconfigure(0, weight=1)
        self.grid_rowconfigure(1, weight=1)
        self.topbar = TopBar(
            self,
            self.model,
            list_presets=presets,
            on_preset=self.load_preset,
            on_load=self.load_config_file,
            on_save=self.save_config_file,
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
        )
        self.footer.grid(row=2, column=0, sticky="ew")
        self.estimate = attach_estimate(self.footer, self.model)  # peak VRAM and s/step beside Start

        self.model.subscribe(self._config_changed)
        self.protocol("WM_DELETE_WINDOW", self.close)
        self._show_tabs()
        self.validate_now()
        if restore_problems:
            # At start-up a note is enough: the fields with problems are marked, and a dialog would greet every launch.
            self.footer.set_status(f"Last session's config: {summarize(restore_problems)}", "warning")

    # -- tabs ----------------------------------------------------------------------------------------------------

    def tab(self, key: str) -> FormTab:
        """The content of tab `key`, built on first use."""
        tab = self.tabs.get(key)
        if tab is None:
            tab = TAB_CLASSES.get(key, FormTab)(self.tabview.page(key), self.model, self.dialogs, key, self)
            self.tabs[key] = tab
            tab.mark(self._problems_by_path())
        self._bring_up_to_date(key)
        return tab

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

    def select_tab(self, key: str) -> FormTab:
        self.tabview.select(key)
        return self.tabs[key]

    # -- config changes ------------------------------------------------------------------------------------------

    def _config_changed(self, path: str | None) -> None:
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
        return self.problems

    def _mark(self, problems: list[Problem]) -> None:
        self.problems = problems
        by_path = self._problems_by_path()
        for tab in self.tabs.values():
            tab.mark(by_path)

    def _problems_by_path(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for problem in errors(self.problems):
            out.setdefault(problem.path, problem.message)
        return out

    def autosave_now(self) -> None:
        try:
            save_last_config(self.model.config)
        except OSError as e:
            self.footer.set_status(f"Could not remember the config for next time: {e}", "warning")

    # -- presets and config files --------------------------------------------------------------------------------

    def load_preset(self, name: str) -> bool:
        try:
            config, problems = load_preset(name)
        except ConfigFileError as e:
            self.dialogs.show_error("Cannot load the preset", str(e))
            return False
        # Presets hold settings, not data: the concepts and samples being edited stay unless the preset has its own.
        current = self.model.config
        if config.concepts is None:
            config.concepts = current.concepts
        if config.samples is None:
            config.samples = current.samples
        self.model.replace(config)
        self.report_loaded(f"Preset '{name}' loaded.", problems)
        return True

    def load_config_file(self, path: str | Path | None = None) -> bool:
        path = path or self.dialogs.open_file("Load config", JSON_FILES)
        if not path:
            return False
        try:
            config, problems = load_config(path)
        except ConfigFileError as e:
            self.dialogs.show_error("Cannot load the config", str(e))
            return False
        self.model.replace(config)
        self.report_loaded(f"Config loaded from {path}.", problems)
        return True

    def report_loaded(self, text: str, problems: list[Problem]) -> None:
        if errors(problems):
            self.footer.set_status(f"{text} {len(errors(problems))} problem(s) need fixing (marked in red).", "warning")
            self.dialogs.show_text("Problems in the loaded config", "\n".join(str(p) for p in problems))
        elif problems:
            self.footer.set_status(f"{text} {summarize(problems)}", "warning")
        else:
            self.footer.set_status(text)

    def save_config_file(self, path: str | Path | None = None) -> Path | None:
        path = path or self.dialogs.save_file("Save config", ".json", JSON_FILES)
        if not path:
            return None
        try:
            save_config(self.model.config, path)
        except OSError as e:
            self.dialogs.show_error("Cannot save the config", str(e))
            return None
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
        notes = f" ({summarize(problems)})" if problems else ""
        self.footer.set_status(f"Config exported to {path}{notes}.", "warning" if problems else "info")
        return Path(path)

    # -- training ------------------------------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self.runner.is_alive() or self.footer.running

    def start(self) -> bool:
        """Start (or, while running, stop). Refuses with every problem listed when the config cannot be trained."""
        if self.running:
            self.stop()
            return False
        config = self.model.config
        reason = not_trainable_reason(config.model_type)
        if reason:
            self.footer.set_status(f"Cannot start: {reason}", "error")
            self.dialogs.show_error("Cannot start training", reason)
            return False
        packed, _ = pack(config)  # run_checks reports problems reading the side files itself
        problems = run_checks(packed)
        self._mark(problems)
        if errors(problems):
            self._refuse(problems)
            return False
        self._terminal_seen = False
        # Destroyed widgets leave Tk objects (fonts, variables) whose finalizers call Tcl. Collect them here, on the
        # Tk thread; else the trainer thread's garbage collection runs those finalizers from the wrong thread.
        gc.collect()
        self.runner.start(packed)
        self.footer.reset_progress()
        self.footer.set_running(True)
        found = warnings(problems)
        if found:
            self.footer.set_status(f"Starting… ({len(found)} warning(s): {found[0].message})", "warning")
        else:
            self.footer.set_status("Starting…")
        self._schedule("poll", POLL_MS, self._poll)
        return True

    def _refuse(self, problems: list[Problem]) -> None:
        errs = errors(problems)
        self.footer.set_status(f"Cannot start, {len(errs)} problem(s): {summarize(errs)}", "error")
        ordered = errs + warnings(problems)
        self.dialogs.show_error(
            "Cannot start training", f"Fix these {len(errs)} problem(s) first:\n\n" + "\n".join(str(p) for p in ordered)
        )

    def stop(self) -> None:
        if self.runner.is_alive():
            self.runner.request_stop()
            self.footer.set_stopping()

    def sample_now(self) -> None:
        if not self.runner.is_alive():
            self.footer.set_status("Sampling now needs a running training: start it first.", "warning")
            return
        self.runner.request_sample()
        self.footer.set_status("A sample will be made at the next step.")

    def save_now(self) -> None:
        self.runner.request_save()
        self.footer.set_status("The model will be saved at the next step.")

    def backup_now(self) -> None:
        self.runner.request_backup()
        self.footer.set_status("A backup will be written at the next step.")

    def open_tensorboard(self) -> str:
        url = f"http://localhost:{self.model.config.tensorboard_port}"
        self._open_url(url)
        self.footer.set_status(f"Opened {url} (TensorBoard runs while training when it is switched on).")
        return url

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
        self.footer.set_running(False)

    def _handle(self, event: Event) -> None:
        self.footer.on_event(event)
        if isinstance(event, SampleReady):
            self.gallery.add(event)
        if isinstance(event, Finished | Failed):
            self._terminal_seen = True
        if isinstance(event, Failed) and not self._closing:
            details = [event.message]
            if event.log_path:
                details.append(f"Log: {event.log_path}")
            if event.traceback:
                details.append(event.traceback)
            self.dialogs.show_error("Training failed", "\n\n".join(details))

    # -- closing -------------------------------------------------------------------------------------------------

    def close(self) -> None:
        """The window's close button: while training, ask, then stop cleanly before closing."""
        if self._closing:
            return
        if self.runner.is_alive():
            if not self.dialogs.ask_yes_no("Quit", "Training is running. Stop it and quit?"):
                return
            self._closing = True
            self.stop()
            self._close_deadline = time.monotonic() + CLOSE_TIMEOUT_S
            self._wait_then_close()
            return
        self._closing = True
        self._shutdown()

    def _wait_then_close(self) -> None:
        # A bounded wait that keeps the window painting (a join on the Tk thread would freeze it).
        if self.runner.is_alive() and time.monotonic() < self._close_deadline:
            self._schedule("close", POLL_MS, self._wait_then_close)
            return
        self._shutdown()

    def _shutdown(self) -> None:
        if self.autosave_enabled:
            self.autosave_now()
        self.destroy()

    def destroy(self) -> None:
        for after_id in self._after_ids.values():
            with contextlib.suppress(tkinter.TclError):
                self.after_cancel(after_id)
        self._after_ids.clear()
        super().destroy()

    def _schedule(self, name: str, delay_ms: int, callback: Callable[[], None]) -> None:
        """Run `callback` once after `delay_ms`; scheduling the same name again replaces the pending call."""
        pending = self._after_ids.pop(name, None)
        if pending is not None:
            self.after_cancel(pending)

        def run() -> None:
            self._after_ids.pop(name, None)
            callback()

        self._after_ids[name] = self.after(delay_ms, run)


def build_parser(prog: str = "train_ui.py") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description="Open the OneTrainer app.")
    parser.add_argument("--preset", metavar="NAME_OR_FILE", help="start from this preset instead of the last config")
    parser.add_argument("--config-path", metavar="FILE", help="start from this config (over the preset, if given)")
    parser.add_argument("--appearance", choices=("dark", "light", "system"), default="dark", help="colour scheme")
    return parser


def main(argv: Sequence[str] | None = None, prog: str = "train_ui.py") -> int:
    args = build_parser(prog).parse_args(argv)
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
        app = App(config)
    except tkinter.TclError as e:
        print(f"error: cannot open a window ({e}); is a display available (DISPLAY)?", file=sys.stderr)
        return 1
    if problems:
        app.report_loaded("Config loaded.", problems)
    app.mainloop()
    return 0
