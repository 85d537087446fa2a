"""The on-disk cache of encoded images (latents) and captions (text-encoder outputs).

Entries are keyed by everything that changes them: the file (path, size and modification time), the bucket and crop,
the augmentation and its variation, the family, the model and the VAE's data type, the caption text. So a second run
with nothing changed encodes nothing, changing one image re-encodes only that image, and clearing the cache is never
needed for correctness. Entries are written atomically, so concurrent runs sharing a cache cannot corrupt it. An entry
damaged anyway (a disk error, a copy cut short) counts as missing: the fill pass encodes it again and rewrites it, and
one that fails to load during training is deleted (and its batch decoded from the image files).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import pickle
import shutil
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from onetrainer.util.disk import is_write_error
from onetrainer.util.fs import atomic_file

if TYPE_CHECKING:
    from onetrainer.config import TrainConfig

log = logging.getLogger(__name__)

CACHE_FORMAT = 1
_ZIP_END = b"PK\x05\x06"  # the zip end-of-directory record that closes every file torch.save writes


def cache_key(parts: dict[str, Any]) -> str:
    text = json.dumps({"format": CACHE_FORMAT, **parts}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


MEMORY_LIMIT_BYTES = 512 * 1024**2


class DiskCache:
    """Entries on disk, with the most recently read ones also kept in memory (up to `memory_limit` bytes): an entry
    never changes under its key, so a copy in memory saves deserialising it again every epoch."""

    def __init__(self, root: Path, kind: str, memory_limit: int = MEMORY_LIMIT_BYTES) -> None:
        self.root = Path(root) / kind
        self.memory_limit = memory_limit
        self._memory: OrderedDict[str, tuple[dict[str, torch.Tensor], int]] = OrderedDict()  # key -> entry, bytes
        self._memory_bytes = 0

    def path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.pt"

    def __contains__(self, key: str) -> bool:
        """The entry is there and complete (a file cut short lacks the end record torch writes last)."""
        return key in self._memory or _looks_complete(self.path(key))

    def get(self, key: str) -> dict[str, torch.Tensor] | None:
        """The entry (callers must not change its tensors in place), or None when it is missing or unreadable."""
        if key in self._memory:
            self._memory.move_to_end(key)
            return self._memory[key][0]
        path = self.path(key)
        if not path.is_file():
            return None
        try:
            entry = torch.load(path, map_location="cpu", weights_only=True)
        except (OSError, RuntimeError, EOFError, ValueError, pickle.UnpicklingError) as e:
            # Damaged: delete it, so that the next fill encodes it again instead of failing on it every run.
            log.warning("cache entry %s is damaged (%s); it is removed and will be encoded again", path, e)
            with contextlib.suppress(OSError):
                path.unlink()
            return None
        self._remember(key, entry)
        return entry

    def _remember(self, key: str, entry: dict[str, torch.Tensor]) -> None:
        size = sum(t.numel() * t.element_size() for t in entry.values())
        if size > self.memory_limit:
            return
        self._memory[key] = (entry, size)
        self._memory_bytes += size
        while self._memory_bytes > self.memory_limit:
            _, (_, dropped) = self._memory.popitem(last=False)
            self._memory_bytes -= dropped

    def put(self, key: str, tensors: dict[str, torch.Tensor]) -> None:
        path = self.path(key)
        try:
            with atomic_file(path) as tmp:
                torch.save({k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}, tmp)
        except RuntimeError as e:
            if not is_write_error(e):
                raise
            # torch's zip writer reports a full disk as "enforce fail at inline_container.cc": say what it is.
            raise OSError(errno.ENOSPC, "No space left on device", str(path)) from e


def _looks_complete(path: Path) -> bool:
    try:
        with path.open("rb") as f:
            f.seek(-22, os.SEEK_END)
            return f.read(4) == _ZIP_END
    except OSError:  # missing, or shorter than the record itself
        return False


def clear_cache(cache_dir: str | Path) -> None:
    """Delete the cache (frees disk space; never needed for correctness)."""
    for kind in ("latents", "text"):
        shutil.rmtree(Path(cache_dir) / kind, ignore_errors=True)


def model_identity(config: TrainConfig, part: str) -> dict[str, Any]:
    """What identifies the weights that produce a cache entry: the model source (with its file's size and time),
    the part's override and data type."""
    source = config.base_model_name
    identity: dict[str, Any] = {"family_model": source, "model_type": config.model_type.value}
    local = Path(source).expanduser()
    if local.exists():
        stat = local.stat()
        identity["source_stat"] = (stat.st_size, stat.st_mtime_ns)
    block = config.part(part)
    identity[f"{part}_override"] = block.model_name
    identity[f"{part}_dtype"] = block.weight_dtype.value
    return identity
