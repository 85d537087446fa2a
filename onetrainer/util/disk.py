"""Write failures in a user's words: "disk full" with the path, instead of errno numbers or torch's
`enforce fail at inline_container.cc`."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

_FULL = (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC))
# What torch's zip writer says when the disk fills up under it (it reports no errno).
_TORCH_WRITE_FAILURES = ("inline_container", "file write failed", "unexpected pos")
# safetensors' writer raises its own SafetensorError with Rust's words for a full disk.
_FULL_WORDS = ("no space left", "storagefull", "disk quota exceeded")


def is_write_error(error: BaseException) -> bool:
    if isinstance(error, OSError):
        return True
    text = str(error).lower()
    if any(w in text for w in _FULL_WORDS):
        return True
    return isinstance(error, RuntimeError) and any(t in text for t in _TORCH_WRITE_FAILURES)


def is_disk_full(error: BaseException) -> bool:
    if isinstance(error, OSError):
        return error.errno in _FULL
    return is_write_error(error)


def write_error_message(error: BaseException, path: str | os.PathLike | None = None) -> str:
    """ "disk full: cannot write PATH (N MB free)", or "cannot write PATH: reason"."""
    target = getattr(error, "filename", None) or path
    where = f" {target}" if target else ""
    if is_disk_full(error):
        free = _free_space(target)
        return f"disk full: cannot write{where}{free}"
    reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
    return f"cannot write{where}: {reason}"


def _free_space(path) -> str:
    if not path:
        return ""
    folder = Path(path)
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return ""
    return f" ({free / 1024**2:.0f} MB free on its drive)"


def unwritable_reason(path: str | os.PathLike, directory: bool = False) -> str | None:
    """Why a file (or, with `directory`, a folder) cannot be created at `path`, or None when it can: an ancestor that
    is a file, or a folder without write permission."""
    target = Path(path).expanduser().absolute()
    folder = target if directory else target.parent
    probe = folder
    while not probe.exists():
        if probe == probe.parent:
            return f"{folder} cannot be created"
        probe = probe.parent
    if not probe.is_dir():
        return f"{probe} is a file, so {folder} cannot be created"
    if not os.access(probe, os.W_OK | os.X_OK):
        return f"{probe} is not writable"
    return None
