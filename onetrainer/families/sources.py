"""Where a model comes from: a diffusers folder, a single file, a hub repo or a backup folder.

Families see only these: a name that stands for something built locally (the demo's tiny models) is resolved to
its folder before a family loads the config (`onetrainer/tiny/source.py`)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
SINGLE_FILE_SUFFIXES = (".safetensors", ".ckpt", ".pt", ".pth")
BACKUP_MARKER = "meta.json"


@dataclass(frozen=True)
class ModelSource:
    kind: str  # "diffusers", "single_file", "hub", "backup"
    location: str  # a path, or the hub repo id

    @property
    def path(self) -> Path:
        return Path(self.location)


class ModelNotFound(Exception):
    pass


def cache_root() -> Path:
    """Where derived files are kept (the CLIP tokenizer folder, built models): $XDG_CACHE_HOME/onetrainer or
    ~/.cache/onetrainer."""
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "onetrainer"


def resolve_local(name: str) -> Path:
    """A model or folder reference as a local path (`~` expanded); whether it exists is the caller's question."""
    return Path(name.strip()).expanduser()


def is_hub_id(name: str) -> bool:
    """`org/name` as the hub spells repositories (not checked against the disk)."""
    return bool(_HUB_ID.match(name.strip()))


def resolve_source(name: str) -> ModelSource:
    name = name.strip()
    local = resolve_local(name)
    if local.is_dir():
        if (local / BACKUP_MARKER).is_file():
            return ModelSource("backup", str(local))
        if (local / "model_index.json").is_file():
            return ModelSource("diffusers", str(local))
        raise ModelNotFound(f"{local} is a folder but not a diffusers model (no model_index.json) or a backup")
    if local.is_file():
        if local.suffix.lower() not in SINGLE_FILE_SUFFIXES:
            raise ModelNotFound(f"{local} is not a model file (.safetensors or .ckpt expected)")
        return ModelSource("single_file", str(local))
    if _HUB_ID.match(name):
        return ModelSource("hub", name)
    raise ModelNotFound(f"model not found: {name}")
