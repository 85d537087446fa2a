"""Writing tiny models as diffusers folders, and a per-user cache of them."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from onetrainer.tiny.registry import TINY_VARIANTS, TinyVariant
from onetrainer.util.fs import atomic_directory
from onetrainer.util.threads import MODEL_LIBRARY_LOCK

if TYPE_CHECKING:
    from diffusers import DiffusionPipeline

# Bump whenever a builder's output changes, so cached folders from older builders are not reused.
TINY_MODEL_VERSION = 3
# Written beside model_index.json; diffusers ignores it. Says what the folder is and which builder made it.
MARKER_FILE = "tiny_model.json"
# One build at a time in this process: a second thread waits and finds the folder built instead of building it again.
# The same lock as every model import and load (`util/threads`), so a build never imports beside the estimate's worker.
TINY_BUILD_LOCK = MODEL_LIBRARY_LOCK
_TOKENIZER_COMPONENTS = ("tokenizer", "tokenizer_2")
# model_index.json entries as the real hub folders have them, where diffusers writes others: transformers without
# torchvision substitutes a PIL image processor. A tiny module adds its own (`MODEL_INDEX_ENTRIES`).
_MODEL_INDEX_ENTRIES = {"CLIPImageProcessorPil": ["transformers", "CLIPImageProcessor"]}


def get_variant(variant: str) -> TinyVariant:
    try:
        return TINY_VARIANTS[variant]
    except KeyError:
        raise KeyError(f"unknown tiny model {variant!r}; known: {', '.join(TINY_VARIANTS)}") from None


def build_tiny_pipeline(variant: str, seed: int = 0) -> DiffusionPipeline:
    """A diffusers pipeline of the named variant with random weights; the same seed gives the same weights."""
    return get_variant(variant).build(seed)


def write_pipeline(pipeline: DiffusionPipeline, folder: Path, variant: TinyVariant, seed: int) -> None:
    """Save `pipeline` into the existing, empty `folder` in the layout users' diffusers models have."""
    from onetrainer.util.quiet import no_progress_bars

    module = variant.tiny_module()
    save = getattr(module, "save_pipeline", None)
    if save is not None:  # not a diffusers pipeline: the module writes its own layout
        save(pipeline, folder)
    else:
        with no_progress_bars():
            pipeline.save_pretrained(folder, safe_serialization=True)
        entries = {**_MODEL_INDEX_ENTRIES, **getattr(module, "MODEL_INDEX_ENTRIES", {})}
        _use_real_model_index_entries(folder / "model_index.json", entries)
        for name in ("text_encoder", "text_encoder_2"):
            if type(getattr(pipeline, name, None)).__name__ == "CLIPTextModel":
                _prefix_clip_text_keys(folder / name)
        for name in _TOKENIZER_COMPONENTS:
            tokenizer = getattr(pipeline, name, None)
            if tokenizer is not None and type(tokenizer).__name__ == "CLIPTokenizer":
                _rewrite_clip_tokenizer(folder / name, tokenizer.pad_token)
    store_extras = getattr(module, "store_extras", None)
    if store_extras is not None:  # what the family's folders hold beyond what the pipeline saves
        store_extras(pipeline, folder, variant)
    marker = {
        "variant": variant.name,
        "model_type": variant.model_type.name,
        "seed": seed,
        "version": TINY_MODEL_VERSION,
    }
    (folder / MARKER_FILE).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")


def _use_real_model_index_entries(path: Path, entries: dict[str, list[str]]) -> None:
    index = json.loads(path.read_text(encoding="utf-8"))
    for name, entry in index.items():
        if isinstance(entry, list) and len(entry) == 2 and entry[1] in entries:
            index[name] = entries[entry[1]]
    path.write_text(json.dumps(index, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _prefix_clip_text_keys(folder: Path) -> None:
    # transformers 5 dropped CLIPTextModel's `text_model` wrapper and saves a freshly built model without it, but
    # every real checkpoint (and transformers 4) names the weights `text_model.…`; transformers 5 strips the prefix
    # again on load. Store the names users' files have.
    from safetensors.torch import load_file, save_file

    for path in folder.glob("*.safetensors"):
        tensors = load_file(path)
        renamed = {k if k.startswith("text_model.") else f"text_model.{k}": v for k, v in tensors.items()}
        save_file(renamed, path, metadata={"format": "pt"})


def _rewrite_clip_tokenizer(folder: Path, pad_token: str) -> None:
    # transformers 5 saves only tokenizer.json; hub SD folders hold vocab.json + merges.txt, which is what users'
    # models (and older transformers versions) load from, so store that layout instead.
    from onetrainer.tiny.tokenizer import write_clip_tokenizer_files

    shutil.rmtree(folder)
    write_clip_tokenizer_files(folder, pad_token=pad_token)


def save_tiny_model(variant: str, dest_dir: str | os.PathLike, seed: int = 0) -> Path:
    """Build the named variant and write it as a diffusers folder (safetensors weights) at `dest_dir`.

    The folder appears complete or not at all: it is written beside `dest_dir` and then renamed into place,
    replacing whatever was there.
    """
    spec = get_variant(variant)
    pipeline = spec.build(seed)
    dest = Path(dest_dir)
    with atomic_directory(dest) as tmp:
        write_pipeline(pipeline, tmp, spec, seed)
    return dest


def default_cache_root() -> Path:
    from onetrainer.families.sources import cache_root

    return cache_root()


def tiny_model_dir(variant: str, cache_root: str | os.PathLike | None = None) -> Path:
    """The folder of the named variant (seed 0) in the cache, built on first use and reused afterwards.

    The cache lives at `<cache_root>/tiny-models/<variant>-v<TINY_MODEL_VERSION>`, `cache_root` defaulting to
    $XDG_CACHE_HOME/onetrainer or ~/.cache/onetrainer. Several processes may ask at once: each builds in its own
    temporary folder and renames it into place; whoever comes second finds the target taken and drops its copy.
    """
    spec = get_variant(variant)
    root = Path(cache_root) if cache_root is not None else default_cache_root()
    target = root / "tiny-models" / f"{spec.name}-v{TINY_MODEL_VERSION}"
    if _is_complete(target):
        return target
    with TINY_BUILD_LOCK:  # the app's estimate and a starting run may both ask for a model not built yet
        if _is_complete(target):  # built by another thread while this one waited
            return target
        return _build(spec, target)


def _build(spec, target: Path) -> Path:
    target.parent.mkdir(parents=True, exist_ok=True)
    pipeline = spec.build(0)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        write_pipeline(pipeline, tmp, spec, seed=0)
        try:
            # Unlike atomic_directory, never replace: a folder already there is complete and may be in use.
            os.rename(tmp, target)
        except OSError:
            if not _is_complete(target):
                raise
    finally:
        with contextlib.suppress(OSError):
            shutil.rmtree(tmp)
    return target


def _is_complete(folder: Path) -> bool:
    # Folders only ever appear by rename, so one with its marker is whole.
    return (folder / MARKER_FILE).is_file()
