"""Where a model comes from: a diffusers folder, a single file, a hub repo, a backup folder, or a tiny local model."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from onetrainer.config.checks import TINY_PREFIX

if TYPE_CHECKING:
    from onetrainer.config import TrainConfig

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
    """Where derived files are kept (the CLIP tokenizer folder, tiny models): $XDG_CACHE_HOME/onetrainer or
    ~/.cache/onetrainer."""
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "onetrainer"


def resolve_local(name: str) -> Path:
    """A `tiny:` name built locally (models: `tiny:sd15`; the demo images: `tiny:images`), or a plain path."""
    if name.startswith(TINY_PREFIX):
        what = name[len(TINY_PREFIX) :]
        if what == "images":
            from onetrainer.tiny.images import demo_images_dir

            return demo_images_dir(cache_root())
        from onetrainer.tiny import TINY_VARIANTS, tiny_model_dir

        if what not in TINY_VARIANTS:
            raise ModelNotFound(f"unknown tiny model '{what}'; available: {', '.join(TINY_VARIANTS)}")
        return tiny_model_dir(what)
    return Path(name).expanduser()


# The parts a `tiny:` base model builds itself beside its prior (`tiny:cascade` → `tiny:cascade-decoder` and a tiny
# EfficientNet encoder). A real model's part does not fit a tiny prior (other widths), and a preset's hub overrides of
# them would only ask the hub for gigabytes the tiny model never uses.
TINY_OWN_PARTS = ("decoder", "effnet_encoder")


def tiny_base_overrides(config: TrainConfig) -> dict[str, str]:
    """The part overrides that do not apply because the base is a `tiny:` model: hub repo ids named for a part the
    tiny model brings itself, by their config path (`decoder.model_name`). A local file or folder still applies."""
    if not config.base_model_name.strip().startswith(TINY_PREFIX):
        return {}
    ignored = {}
    for part in TINY_OWN_PARTS:
        name = (config.part(part).model_name or "").strip()
        if name and not name.startswith(TINY_PREFIX) and is_hub_id(name) and not Path(name).expanduser().exists():
            ignored[f"{part}.model_name"] = name
    return ignored


_PART_WORDS = {"decoder": "decoder", "effnet_encoder": "EfficientNet encoder"}


def tiny_base_notice(base: str, ignored: dict[str, str]) -> str:
    """One line for the overrides a tiny base does without (`tiny_base_overrides`)."""
    parts = " and ".join(_PART_WORDS[path.split(".")[0]] for path in ignored)
    names = ", ".join(f"{path} '{name}'" for path, name in ignored.items())
    return f"the tiny base model {base} brings its own {parts}: {names} not used"


def drop_tiny_base_overrides(config: TrainConfig) -> str:
    """Clear the overrides `tiny_base_overrides` names, in place, before a family loads the config; the notice ("" when
    there were none)."""
    ignored = tiny_base_overrides(config)
    for path in ignored:
        config.part(path.split(".")[0]).model_name = ""
    return tiny_base_notice(config.base_model_name.strip(), ignored) if ignored else ""


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
