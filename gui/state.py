"""The app's memory between sessions: the last config, saved atomically on change and on exit.

It lives in `$ONETRAINER_STATE_DIR` when set (tests), else `$XDG_CONFIG_HOME/onetrainer` or `~/.config/onetrainer`.
"""

from __future__ import annotations

import os
from pathlib import Path

from onetrainer.config import ConfigFileError, Problem, TrainConfig, load_config, save_config

STATE_DIR_ENV = "ONETRAINER_STATE_DIR"
LAST_CONFIG_NAME = "last-config.json"


def state_dir() -> Path:
    explicit = os.environ.get(STATE_DIR_ENV)
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(base) / "onetrainer"


def last_config_path() -> Path:
    return state_dir() / LAST_CONFIG_NAME


def save_last_config(config: TrainConfig) -> Path:
    """Write the config where the next start finds it (atomic: a crash never leaves half a file)."""
    path = last_config_path()
    save_config(config, path)
    return path


def load_last_config() -> tuple[TrainConfig | None, list[Problem]]:
    """The config of the last session, with the problems found reading it; None when there is none or it is broken."""
    path = last_config_path()
    if not path.is_file():
        return None, []
    try:
        return load_config(path)
    except ConfigFileError as e:
        return None, [Problem("", f"the last session's config could not be restored: {e}")]
