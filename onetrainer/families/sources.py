"""Where a model comes from: a diffusers folder, a single file, a hub repo or a backup folder.

Families see only these: a name that stands for something built locally is resolved to its folder before a family
loads the config, by the source registered for the name's prefix (`register_source`, `prepare_config` below)."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from onetrainer.config import TrainConfig

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
SINGLE_FILE_SUFFIXES = (".safetensors", ".ckpt", ".pt", ".pth")
BACKUP_MARKER = "meta.json"
# What marks a diffusers pipeline folder: its index, or a modular pipeline's (diffusers' ModularPipeline).
PIPELINE_INDEX_FILES = ("model_index.json", "modular_model_index.json")


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


def _plain_path(name: str) -> Path:
    return Path(name.strip()).expanduser()


def is_hub_id(name: str) -> bool:
    """`org/name` as the hub spells repositories (not checked against the disk)."""
    return bool(_HUB_ID.match(name.strip()))


def is_pipeline_folder(folder: Path) -> bool:
    """Whether `folder` is a diffusers pipeline folder (its `model_index.json`, or a modular pipeline's index)."""
    return any((folder / name).is_file() for name in PIPELINE_INDEX_FILES)


def resolve_source(name: str) -> ModelSource:
    name = name.strip()
    local = _plain_path(name)  # a family sees local paths only: the run has prepared its config
    if local.is_dir():
        if (local / BACKUP_MARKER).is_file():
            return ModelSource("backup", str(local))
        if is_pipeline_folder(local):
            return ModelSource("diffusers", str(local))
        raise ModelNotFound(f"{local} is a folder but not a diffusers model (no model_index.json) or a backup")
    if local.is_file():
        if local.suffix.lower() not in SINGLE_FILE_SUFFIXES:
            raise ModelNotFound(f"{local} is not a model file (.safetensors or .ckpt expected)")
        return ModelSource("single_file", str(local))
    if _HUB_ID.match(name):
        return ModelSource("hub", name)
    raise ModelNotFound(f"model not found: {name}")


# Named-model sources: a name prefix (`tiny:` for the demo's models) that stands for something a source builds or
# finds locally. The package that knows such names registers its source (`register_source`); the run, its checks and
# the tools ask only the functions below, so nothing under the families, the config or the training package knows
# which sources exist. A name whose source is not registered is a plain path (one that does not exist).


class LocalSource(Protocol):
    """What a named-model source tells the run about its names (those that start with its prefix)."""

    what: str  # how a failure names it: "cannot build {what}: …"

    def unknown_reason(self, name: str) -> str | None:
        """Why `name` cannot be resolved, listing the names that can; None when it can."""
        ...

    def resolve(self, name: str) -> Path:
        """The local file or folder `name` stands for, built on demand (a known name)."""
        ...

    def prepare(self, config: TrainConfig) -> str:
        """Rewrite the run's copy of `config` in place: its names become local paths, with what the source brings
        itself filled in. Returns a notice for the user ("" when none)."""
        ...

    def ignored_overrides(self, config: TrainConfig) -> dict[str, str]:
        """The names in `config` that `prepare` drops because its source brings the part itself, by config path
        (`decoder.model_name`); the checks leave them unchecked."""
        ...

    def ignored_notice(self, config: TrainConfig, ignored: dict[str, str]) -> str:
        """One line telling the user about `ignored` (this source's `ignored_overrides`, not empty)."""
        ...

    def sample_note(self, name: str) -> str:
        """What to expect of the samples of a base model `name` stands for ("" when nothing unusual): the demo's
        random-weight models draw noise, whatever the prompt."""
        ...


class SourceFailed(Exception):
    """A registered source could not prepare a config (or a hub file could not be fetched): `error` is what it
    raised."""

    def __init__(self, what: str, error: Exception, verb: str = "build") -> None:
        super().__init__(f"cannot {verb} {what}: {error}")
        self.error = error


_SOURCES: dict[str, LocalSource] = {}


def register_source(prefix: str, source: LocalSource) -> Callable[[], None]:
    """Make names that start with `prefix` stand for what `source` resolves. Returns the undo (a test's fake source
    restores what was registered before)."""
    before = _SOURCES.get(prefix)
    _SOURCES[prefix] = source

    def undo() -> None:
        if before is None:
            _SOURCES.pop(prefix, None)
        else:
            _SOURCES[prefix] = before

    return undo


def source_for(name: str) -> LocalSource | None:
    """The registered source whose prefix `name` starts with (the longest such prefix), else None."""
    name = name.strip()
    prefixes = [p for p in _SOURCES if name.startswith(p)]
    return _SOURCES[max(prefixes, key=len)] if prefixes else None


def sample_note(base_model_name: str) -> str:
    """The note of the source `base_model_name` belongs to about its samples ("" for any other model)."""
    note = getattr(source_for(base_model_name), "sample_note", None)  # optional: a source may have nothing to say
    return note(base_model_name.strip()) if note else ""


def unknown_source_reason(name: str) -> str | None:
    """Why a registered source cannot resolve `name`; None when it can or when no registered source claims it."""
    source = source_for(name)
    return source.unknown_reason(name.strip()) if source else None


def resolve_local(name: str) -> Path:
    """A model or folder reference as a local path: a registered source's name → what it builds (ModelNotFound for
    one it does not know), else the plain path (`~` expanded; whether it exists is the caller's question)."""
    name = name.strip()
    source = source_for(name)
    if source is None:
        return _plain_path(name)
    reason = source.unknown_reason(name)
    if reason:
        raise ModelNotFound(reason)
    return source.resolve(name)


def prepare_config(config: TrainConfig) -> str:
    """Every registered source's `prepare` on `config` (in place: pass the run's copy), so that what loads it sees
    local paths only. Returns their notices, one a line ("" when none). Raises SourceFailed for a source that cannot
    (an unknown name: the run checks report it first; a build that failed)."""
    fetch_hub_files(config)
    notices = []
    for source in list(_SOURCES.values()):
        try:
            notice = source.prepare(config)
        except Exception as e:
            raise SourceFailed(source.what, e) from e
        if notice:
            notices.append(notice)
    return "\n".join(notices)


def fetch_hub_files(config: TrainConfig) -> None:
    """Model names that link one file of a hub repository (`https://huggingface.co/<repo>/blob/<revision>/<file>`, as
    OneTrainer's presets name single-file models) become that file in the local hub cache, downloaded once (in place:
    pass the run's copy). Raises SourceFailed when it is not cached and cannot be downloaded (the checks say so
    first)."""
    from onetrainer.config.model_types import MODEL_TYPES
    from onetrainer.util.hub import download_hub_file, hub_file

    info = MODEL_TYPES.get(config.model_type)
    holders = [("base_model_name", config, "base_model_name")]
    holders += [(f"{part}.model_name", config.part(part), "model_name") for part in (info.family.parts if info else ())]
    for path, holder, field in holders:
        file = hub_file(getattr(holder, field))
        if file is None:
            continue
        what = "the base model" if path == "base_model_name" else f"the {path.split('.')[0]} model"
        try:
            local = download_hub_file(file, config.huggingface_cache_dir or None, config.offline_mode, what)
        except FileNotFoundError as error:
            raise SourceFailed(f"{path} ({file.url})", error, verb="download") from error
        setattr(holder, field, str(local))


def ignored_overrides(config: TrainConfig) -> dict[str, str]:
    """The names in `config` that `prepare_config` drops (the registered sources' `ignored_overrides`)."""
    ignored: dict[str, str] = {}
    for source in _SOURCES.values():
        ignored.update(source.ignored_overrides(config))
    return ignored


def ignored_overrides_notice(config: TrainConfig) -> str:
    """The lines about what `ignored_overrides` drops, one per source that drops something ("" when none)."""
    notices = []
    for source in _SOURCES.values():
        ignored = source.ignored_overrides(config)
        if ignored:
            notices.append(source.ignored_notice(config, ignored))
    return "\n".join(notices)
