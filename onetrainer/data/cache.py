"""The on-disk cache of encoded images (latents) and captions (text-encoder outputs).

Entries are keyed by everything that changes them: the file (path, size and modification time), the bucket and crop,
the augmentation and its variation, the family, the model and the VAE's data type, the caption text. So a second run
with nothing changed encodes nothing, changing one image re-encodes only that image, and clearing the cache is never
needed for correctness. Entries are safetensors files (quick to read, and nothing in them runs), written atomically,
so concurrent runs sharing a cache cannot corrupt it. An entry damaged anyway (a disk error, a copy cut short) counts
as missing: the fill pass encodes it again and rewrites it, and one that fails to load during training is deleted (and
its batch decoded from the image files).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors

from onetrainer.util.fs import atomic_file
from onetrainer.weights.checkpoint_files import parse_safetensors_header

if TYPE_CHECKING:
    from onetrainer.config import TrainConfig

log = logging.getLogger(__name__)

CACHE_FORMAT = 2  # 2: safetensors entries of their own size; 1: torch.save files holding their encoding batch


def cache_key(parts: dict[str, Any]) -> str:
    text = json.dumps({"format": CACHE_FORMAT, **parts}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


MEMORY_LIMIT_BYTES = 512 * 1024**2


class DiskCache:
    """Entries on disk, with the most recently written or read ones also kept in memory (up to `memory_limit` bytes):
    an entry never changes under its key, so a copy in memory saves deserialising it again every epoch (and the first
    epoch reading back what the fill pass has just written)."""

    def __init__(self, root: Path, kind: str, memory_limit: int = MEMORY_LIMIT_BYTES) -> None:
        self.root = Path(root) / kind
        self.memory_limit = memory_limit
        self._memory: OrderedDict[str, tuple[dict[str, torch.Tensor], int]] = OrderedDict()  # key -> entry, bytes
        self._memory_bytes = 0

    def path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.safetensors"

    def __contains__(self, key: str) -> bool:
        """The entry is there and complete (a file cut short is shorter than its header says)."""
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
            entry = read_entry(path)
        except (OSError, SafetensorError, ValueError) as e:
            # Damaged: delete it, so that the next fill encodes it again instead of failing on it every run.
            log.warning("cache entry %s is damaged (%s); it is removed and will be encoded again", path, e)
            with contextlib.suppress(OSError):
                path.unlink()
            return None
        self._remember(key, entry)
        return entry

    def _remember(self, key: str, entry: dict[str, torch.Tensor]) -> None:
        if key in self._memory:  # written again (an entry repaired): counted once
            self._memory_bytes -= self._memory.pop(key)[1]
        size = sum(t.numel() * t.element_size() for t in entry.values())
        if size > self.memory_limit:
            return
        self._memory[key] = (entry, size)
        self._memory_bytes += size
        while self._memory_bytes > self.memory_limit:
            _, (_, dropped) = self._memory.popitem(last=False)
            self._memory_bytes -= dropped

    def put(self, key: str, tensors: dict[str, torch.Tensor]) -> None:
        seen: set[int] = set()
        entry = {name: _own_storage(value.detach().to("cpu"), seen) for name, value in tensors.items()}
        with atomic_file(self.path(key)) as tmp:
            tmp.write_bytes(save_safetensors(entry))
        self._remember(key, entry)


def read_entry(path: Path) -> dict[str, torch.Tensor]:
    """A cache entry file's tensors (read whole, then parsed: for files of a few KiB this is several times faster than
    mapping them)."""
    return load_safetensors(path.read_bytes())


def _own_storage(tensor: torch.Tensor, seen: set[int]) -> torch.Tensor:
    """`tensor`, copied where it shares its storage: a row of the batch it was encoded in (kept in memory, the entry
    would hold its whole batch), or a tensor given under two names (safetensors refuses shared storage)."""
    storage = tensor.untyped_storage()
    whole = tensor.is_contiguous() and tensor.storage_offset() == 0 and storage.nbytes() == tensor.nbytes
    if not whole or storage.data_ptr() in seen:
        tensor = tensor.clone(memory_format=torch.contiguous_format)
    if tensor.nbytes:
        seen.add(tensor.untyped_storage().data_ptr())
    return tensor


def _looks_complete(path: Path) -> bool:
    """The file is as long as its safetensors header says (a file cut short, or not an entry at all, is not)."""
    try:
        with path.open("rb") as f:
            header = parse_safetensors_header(f)
            end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
            return os.fstat(f.fileno()).st_size == f.tell() + end
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError):
        return False


def remove_outdated_entries(cache_dir: str | Path) -> tuple[int, int]:
    """Delete entries an earlier cache format wrote (never read again: their keys name the format): how many, and
    their bytes."""
    count = size = 0
    for kind in ("latents", "text"):
        for path in (Path(cache_dir) / kind).glob("*/*.pt"):
            with contextlib.suppress(OSError):
                length = path.stat().st_size
                path.unlink()
                count, size = count + 1, size + length
    return count, size


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
