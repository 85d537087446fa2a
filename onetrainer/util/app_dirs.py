"""The user's folder for the app's own files (the last config, the user's presets, the queue of runs).

It is `$ONETRAINER_STATE_DIR` when set (tests), else `$XDG_CONFIG_HOME/onetrainer` or `~/.config/onetrainer`. The app
and the command line share it: a run queued in one is seen by the other.
"""

from __future__ import annotations

import os
from pathlib import Path

STATE_DIR_ENV = "ONETRAINER_STATE_DIR"


def state_dir() -> Path:
    explicit = os.environ.get(STATE_DIR_ENV)
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(base) / "onetrainer"
