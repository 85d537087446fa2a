"""`tiny:` names as a model source: resolved to local folders and files once, before any family loads a config.

A user may name a tiny model (`tiny:<variant>`) as the base model, or the demo images (`tiny:images`)
as a concept folder, to try the trainer offline. The families, the config and the training package know nothing of
these names: importing this module (or `onetrainer.tiny`) registers `TinySource` for the `tiny:` prefix with the
families' source registry (`onetrainer/families/sources.py`), and the run (`training/runner.py`), `sample.py` and the
tools call its generic `prepare_config` on their copy of the config, which builds what is named (once, into the
user's cache) and puts its local path in the config. The entry points import this module: the CLI's commands, the
app, the benchmarks, the tests. Nothing here imports torch until a model is built.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from onetrainer.families.sources import ModelNotFound, cache_root, is_hub_id, register_source, resolve_local

if TYPE_CHECKING:
    from onetrainer.config import TrainConfig

TINY_PREFIX = "tiny:"
DEMO_IMAGES = "images"  # `tiny:images`: the demo's generated concept folder
DEMO_CLIPS = "clips"  # `tiny:clips`: generated clips (moving shapes) and a still, for the video try-it

_PART_WORDS = {"decoder": "decoder", "effnet_encoder": "EfficientNet encoder"}


def is_tiny_name(name: str) -> bool:
    """Whether `name` asks for something built locally (`tiny:…`), known or not."""
    return name.strip().startswith(TINY_PREFIX)


def unknown_tiny_reason(name: str) -> str:
    """Why a `tiny:` name cannot be built ("" when it can): the names that can, listed."""
    from onetrainer.tiny.registry import TINY_VARIANTS

    what = name.strip()[len(TINY_PREFIX) :]
    if what in (DEMO_IMAGES, DEMO_CLIPS) or what in TINY_VARIANTS:
        return ""
    return f"unknown tiny model '{what}'; available: {', '.join(TINY_VARIANTS)}"


def _build(name: str) -> Path:
    """The local folder of a `tiny:` name (models: `tiny:<variant>`; the demo images: `tiny:images`, clips:
    `tiny:clips`), built once.

    Raises ModelNotFound for an unknown one."""
    reason = unknown_tiny_reason(name)
    if reason:
        raise ModelNotFound(reason)
    what = name.strip()[len(TINY_PREFIX) :]
    if what == DEMO_IMAGES:
        from onetrainer.tiny.images import demo_images_dir

        return demo_images_dir(cache_root())
    if what == DEMO_CLIPS:
        from onetrainer.tiny.clips import demo_clips_dir

        return demo_clips_dir(cache_root())
    from onetrainer.tiny.storage import tiny_model_dir

    return tiny_model_dir(what)


def _own_parts(name: str) -> tuple[str, ...]:
    """The parts the tiny base `name` (a known `tiny:` model name) brings itself beside its folder
    (`TinyVariant.own_parts`): a real model's part would not fit its widths."""
    from onetrainer.tiny.registry import TINY_VARIANTS

    variant = TINY_VARIANTS.get(name[len(TINY_PREFIX) :])
    return variant.own_parts if variant is not None else ()


def _build_own_part(name: str, part: str) -> Path:
    """Build (once, into the cache) the part `part` of the tiny base `name`; its local path."""
    from onetrainer.tiny.registry import TINY_VARIANTS

    variant = TINY_VARIANTS[name[len(TINY_PREFIX) :]]
    return variant.tiny_module().build_own_part(variant, part)


def tiny_base_overrides(config: TrainConfig) -> dict[str, str]:
    """The part overrides that do not apply because the base is a `tiny:` model: hub repo ids named for a part the
    tiny model brings itself, by their config path (`decoder.model_name`). A preset's hub overrides would only ask
    the hub for gigabytes the tiny model never uses; a local file or folder still applies."""
    base = config.base_model_name.strip()
    if not is_tiny_name(base) or unknown_tiny_reason(base):
        return {}
    ignored = {}
    for part in _own_parts(base):
        name = (config.part(part).model_name or "").strip()
        if name and not is_tiny_name(name) and is_hub_id(name) and not Path(name).expanduser().exists():
            ignored[f"{part}.model_name"] = name
    return ignored


def tiny_base_notice(base: str, ignored: dict[str, str]) -> str:
    """One line for the overrides a tiny base does without (`tiny_base_overrides`)."""
    parts = " and ".join(_PART_WORDS.get(path.split(".")[0], path.split(".")[0]) for path in ignored)
    names = ", ".join(f"{path} '{name}'" for path, name in ignored.items())
    return f"the tiny base model {base} brings its own {parts}: {names} not used"


def resolve_tiny_sources(config: TrainConfig) -> str:
    """Replace every `tiny:` name in `config` (in place: pass the run's copy) with the local path of what it builds:
    the base model, a part's model, a concept folder; fill the parts a tiny base brings itself (`own_parts`) where
    the config names none, and clear the hub overrides of them it does without.

    Returns the notice about those overrides ("" when there were none). Raises ModelNotFound for an unknown `tiny:`
    name (the run checks report it first)."""
    base = config.base_model_name.strip()
    notice = ""
    if is_tiny_name(base):
        ignored = tiny_base_overrides(config)
        for path in ignored:
            config.part(path.split(".")[0]).model_name = ""
        notice = tiny_base_notice(base, ignored) if ignored else ""
        config.base_model_name = str(_build(base))
        for part in _own_parts(base):
            if not config.part(part).model_name.strip():
                config.part(part).model_name = str(_build_own_part(base, part))
    from onetrainer.config.model_types import all_parts

    for part in all_parts():
        name = config.part(part).model_name or ""
        if is_tiny_name(name):
            config.part(part).model_name = str(_build(name))
    for concept in config.concepts or []:
        if is_tiny_name(concept.path):
            concept.path = str(_build(concept.path))
    return notice


RANDOM_WEIGHTS_NOTE = (
    "The demo's tiny model has random weights: its samples are coloured noise, whatever the prompt. "
    "A real base model draws the prompt."
)


class TinySource:
    """The `tiny:` names as a named-model source (`onetrainer.families.sources.LocalSource`)."""

    what = "the tiny model"

    def unknown_reason(self, name: str) -> str | None:
        return unknown_tiny_reason(name) or None

    def resolve(self, name: str) -> Path:
        return _build(name)

    def prepare(self, config: TrainConfig) -> str:
        return resolve_tiny_sources(config)

    def ignored_overrides(self, config: TrainConfig) -> dict[str, str]:
        return tiny_base_overrides(config)

    def ignored_notice(self, config: TrainConfig, ignored: dict[str, str]) -> str:
        return tiny_base_notice(config.base_model_name.strip(), ignored)

    def sample_note(self, name: str) -> str:
        return RANDOM_WEIGHTS_NOTE


# On import, so that every entry point that imports this module (or `onetrainer.tiny`) knows the `tiny:` names.
register_source(TINY_PREFIX, TinySource())

__all__ = [
    "DEMO_CLIPS",
    "DEMO_IMAGES",
    "TINY_PREFIX",
    "TinySource",
    "is_tiny_name",
    "resolve_local",  # the generic resolver (`tiny:` names registered above), for the benchmarks and tests
    "resolve_tiny_sources",
    "tiny_base_notice",
    "tiny_base_overrides",
    "unknown_tiny_reason",
]
