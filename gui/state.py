"""The app's memory between sessions: the last config, saved atomically on change and on exit.

It lives in `$ONETRAINER_STATE_DIR` when set (tests), else `$XDG_CONFIG_HOME/onetrainer` or `~/.config/onetrainer`
(`onetrainer/util/app_dirs.py`: the queue of runs lives there too).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from onetrainer.config import ConfigFileError, Problem, TrainConfig, load_config, save_config
from onetrainer.util.app_dirs import STATE_DIR_ENV, state_dir  # noqa: F401  (STATE_DIR_ENV: named from here too)
from onetrainer.util.fs import atomic_write_json

LAST_CONFIG_NAME = "last-config.json"
# Which concepts and samples of the last config came with a preset (see App.load_preset): kept beside the last config
# so that the next preset still drops them after a restart.
PRESET_DATA_NAME = "last-preset-data.json"
USER_PRESETS = "presets"
# What a preset leaves alone: the user's data (see App.load_preset).
DATA_FIELDS = ("concepts", "samples")


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


def preset_data_path() -> Path:
    return state_dir() / PRESET_DATA_NAME


def save_preset_data(data: dict[str, list[dict[str, Any]] | None]) -> Path:
    """Remember the concepts and samples (as dicts) the last preset brought, per field (None: it brought none)."""
    path = preset_data_path()
    atomic_write_json(path, {field: data.get(field) for field in DATA_FIELDS})
    return path


def load_preset_data() -> dict[str, list[dict[str, Any]] | None]:
    """What `save_preset_data` remembered; nothing (every field None) when there is no file or it is damaged: then
    every concept and sample counts as the user's, which never drops anything of theirs."""
    try:
        saved = json.loads(preset_data_path().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(saved, dict):
        return {}
    out: dict[str, list[dict[str, Any]] | None] = {}
    for field in DATA_FIELDS:
        items = saved.get(field)
        ok = isinstance(items, list) and all(isinstance(item, dict) for item in items)
        out[field] = items if ok else None
    return out


# -- the user's own presets ----------------------------------------------------------------------------------------


def user_presets_dir() -> Path:
    """Where "Save as my preset" writes: `presets/` in the state folder (`~/.config/onetrainer/presets`)."""
    return state_dir() / USER_PRESETS


def list_user_presets() -> list[str]:
    folder = user_presets_dir()
    if not folder.is_dir():
        return []
    return sorted(p.relative_to(folder).with_suffix("").as_posix() for p in folder.rglob("*.json"))


def user_preset_path(name: str) -> Path:
    return user_presets_dir() / f"{name}.json"


def preset_name_problem(name: str) -> str | None:
    """Why `name` cannot name a preset file (None when it can): letters, digits, spaces, - _ . and / for folders."""
    if not name.strip():
        return "the name is empty"
    if not re.fullmatch(r"[\w .\-/]+", name) or any(part in ("", ".", "..") for part in name.split("/")):
        return f"'{name}' cannot be a file name (use letters, digits, spaces, - _ . and / for folders)"
    return None


def save_user_preset(config: TrainConfig, name: str) -> Path:
    """The config's settings as a preset the Load preset menu lists; concepts and samples are the user's data and
    stay out (loading the preset keeps whatever concepts and samples are being edited then)."""
    preset = config.copy()
    for field in DATA_FIELDS:
        setattr(preset, field, None)
    path = user_preset_path(name)
    save_config(preset, path)
    return path
