"""Reading and writing configs: JSON files, presets, the layering of the CLI, concept and sample side files."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

from onetrainer.config.concept_config import ConceptConfig
from onetrainer.config.sample_config import SampleConfig
from onetrainer.config.schema import VERSION_KEY, ConfigNode, Problem, Severity, convert, set_path
from onetrainer.config.train_config import TrainConfig
from onetrainer.config.validation import validate
from onetrainer.util.fs import atomic_write_json

PRESETS_DIR = Path(os.environ.get("ONETRAINER_PRESETS_DIR", Path(__file__).resolve().parents[2] / "presets"))


class ConfigFileError(Exception):
    """A config file that cannot be read at all (missing, not JSON, not an object)."""


def read_json(path: str | os.PathLike, what: str = "config file") -> Any:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise ConfigFileError(f"{what} not found: {path}") from None
    except OSError as e:
        raise ConfigFileError(f"cannot read {what} {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise ConfigFileError(f"{what} {path} is not UTF-8 text") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigFileError(
            f"{what} {path} is not valid JSON: {e.msg} at line {e.lineno}, column {e.colno}"
        ) from None


def read_config_dict(path: str | os.PathLike, what: str = "config file") -> dict[str, Any]:
    data = read_json(path, what)
    if not isinstance(data, dict):
        raise ConfigFileError(f"{what} {path} must hold a JSON object, not {type(data).__name__}")
    return data


# ---------------------------------------------------------------------------------------------------------------------
# Loading


def config_from_dict(data: dict[str, Any]) -> tuple[TrainConfig, list[Problem]]:
    """A sparse or full config dict → a validated config and every problem found (conversion and schema)."""
    problems: list[Problem] = []
    config = TrainConfig.from_dict(data, problems)
    problems += validate(config)
    return config, problems


def load_config(path: str | os.PathLike) -> tuple[TrainConfig, list[Problem]]:
    return config_from_dict(read_config_dict(path))


def deep_merge(base: dict[str, Any], overlay: dict[str, Any]) -> dict[str, Any]:
    """Overlay a sparse dict on another: objects merge key by key, everything else (lists too) is replaced."""
    out = copy.deepcopy(base)
    for key, value in overlay.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def parse_set_value(text: str) -> Any:
    """A `--set` value: JSON when it parses (numbers, true/false, null, lists, objects), else the text itself."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def load_layers(
    preset: str | None = None,
    config_path: str | os.PathLike | None = None,
    overrides: list[str] | tuple[str, ...] = (),
) -> tuple[TrainConfig, list[Problem]]:
    """defaults ← preset ← config file ← each `KEY=VALUE` override, in that order; every problem is returned.

    Each layer is migrated on its own before merging, so a preset and a config of different versions combine.
    Raises ConfigFileError when a file cannot be read at all.
    """
    merged: dict[str, Any] = {}
    if preset:
        merged = deep_merge(merged, TrainConfig.migrate(read_config_dict(preset_path(preset), "preset")))
    if config_path:
        merged = deep_merge(merged, TrainConfig.migrate(read_config_dict(config_path)))
    problems: list[Problem] = []
    config = TrainConfig.from_dict(merged, problems)
    for item in overrides:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            problems.append(Problem("", f"--set needs KEY=VALUE, got '{item}'"))
            continue
        if key.startswith(("concepts", "samples")):
            _materialize_side_file(config, key.split(".")[0], problems)
        problems += set_path(config, key, parse_set_value(raw))
    problems += validate(config)
    return config, problems


# ---------------------------------------------------------------------------------------------------------------------
# Concept and sample side files


def _side_file_spec(kind: str) -> tuple[str, type[ConfigNode], str]:
    if kind == "concepts":
        return "concept_file_name", ConceptConfig, "concept file"
    return "sample_definition_file_name", SampleConfig, "sample file"


def read_side_file(path: str | os.PathLike, kind: str) -> tuple[list, list[Problem]]:
    """Read a concepts or samples file (a JSON list). A missing file is an empty list."""
    _, cls, what = _side_file_spec(kind)
    problems: list[Problem] = []
    if not Path(path).exists():
        return [], problems
    data = read_json(path, what)
    if not isinstance(data, list):
        return [], [Problem(kind, f"{what} {path} must hold a JSON list")]
    from onetrainer.config.schema import FieldType

    ok, items = convert(data, FieldType("list", item=FieldType("node", cls=cls)), kind, problems)
    return (items if ok else []), problems


def _materialize_side_file(config: TrainConfig, kind: str, problems: list[Problem]) -> None:
    if getattr(config, kind) is None:
        file_field, _, _ = _side_file_spec(kind)
        try:
            items, found = read_side_file(getattr(config, file_field), kind)
        except ConfigFileError as e:
            problems.append(Problem(file_field, str(e)))
            items, found = [], []
        problems += found
        setattr(config, kind, items)


def pack(config: TrainConfig) -> tuple[TrainConfig, list[Problem]]:
    """A copy with the concepts and samples inlined (read from their side files where not inline)."""
    packed = config.copy()
    problems: list[Problem] = []
    for kind in ("concepts", "samples"):
        _materialize_side_file(packed, kind, problems)
    return packed, problems


def save_config(config: TrainConfig, path: str | os.PathLike) -> None:
    """Write the config as JSON, atomically (a crash mid-save never leaves a broken file)."""
    atomic_write_json(path, config.to_dict())


def save_side_file(items: list[ConfigNode], path: str | os.PathLike) -> None:
    atomic_write_json(path, [item.to_dict() for item in items])


# ---------------------------------------------------------------------------------------------------------------------
# Presets


def list_presets() -> list[str]:
    """Preset names: each file's path under `presets/` without `.json` (e.g. `<model>/lora`), sorted."""
    if not PRESETS_DIR.is_dir():
        return []
    return sorted(p.relative_to(PRESETS_DIR).with_suffix("").as_posix() for p in PRESETS_DIR.rglob("*.json"))


def preset_path(name_or_file: str | os.PathLike) -> Path:
    """A preset name (`<model>/lora`) or a path to a JSON file."""
    candidate = Path(name_or_file)
    if candidate.suffix == ".json" and candidate.is_file():
        return candidate
    named = PRESETS_DIR / f"{Path(name_or_file).as_posix()}.json"
    if named.is_file():
        return named
    if candidate.is_file():
        return candidate
    available = ", ".join(list_presets()) or "none"
    raise ConfigFileError(f"preset '{name_or_file}' not found (a file, or one of: {available})")


def load_preset(name_or_file: str | os.PathLike) -> tuple[TrainConfig, list[Problem]]:
    """A preset over the defaults."""
    return config_from_dict(read_config_dict(preset_path(name_or_file), "preset"))


def problems_text(problems: list[Problem]) -> str:
    return "\n".join(f"  {p}" for p in problems)


__all__ = [
    "VERSION_KEY",
    "ConfigFileError",
    "Severity",
    "config_from_dict",
    "deep_merge",
    "list_presets",
    "load_config",
    "load_layers",
    "load_preset",
    "pack",
    "preset_path",
    "read_side_file",
    "save_config",
    "save_side_file",
]
