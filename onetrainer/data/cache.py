"""The on-disk cache of encoded images (latents) and captions (text-encoder outputs).

Entries are keyed by everything that changes them: the file (path, size and modification time), the bucket and crop,
the augmentation and its variation, the family, the model and the VAE's data type, the caption text. So a second run
with nothing changed encodes nothing, changing one image re-encodes only that image, and clearing the cache is never
needed for correctness. Entries are written atomically, so concurrent runs sharing a cache cannot corrupt it.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import shutil
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch

from onetrainer.util.fs import atomic_file

CACHE_FORMAT = 1


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
        return self.path(key).is_file()

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
        except (OSError, RuntimeError, EOFError, ValueError, pickle.UnpicklingError):
            return None  # an unreadable entry is encoded again
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
        with atomic_file(self.path(key)) as tmp:
            torch.save({k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}, tmp)


def clear_cache(cache_dir: str | Path) -> None:
    """Delete the cache (frees disk space; never needed for correctness)."""
    for kind in ("latents", "text"):
        shutil.rmtree(Path(cache_dir) / kind, ignore_errors=True)


def model_identity(config, part: str) -> dict[str, Any]:
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
