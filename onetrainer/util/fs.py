"""Atomic writes: a crash mid-write never leaves a broken file or folder behind (write, then rename).

Every file and folder written here ends with the permissions the user's umask gives new files (0644 / 0755 for the
usual 022): temporary files and safetensors' writer create them owner-only (0600), which an AUTOMATIC1111 or ComfyUI
running as another user (a container, a shared model folder) cannot read.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# Temporary names carry the writing process's id, so a later run can tell a killed write's leftovers from a write
# that another process is doing right now.
_TAG = f"pid{os.getpid()}-"
_LEFTOVER = re.compile(r"^\..+\.pid(\d+)-[^.]+\.(tmp|old)$")


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{_TAG}", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        readable_by_others(Path(tmp))
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, data: Any) -> None:
    atomic_write_text(path, json.dumps(data, indent=4, ensure_ascii=False) + "\n")


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `path`; when the block succeeds it replaces `path` in one rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{_TAG}{uuid.uuid4().hex[:8]}.tmp")
    try:
        yield tmp
        readable_by_others(tmp)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary folder beside `path`; when the block succeeds it takes `path`'s place.

    An existing folder at `path` is moved aside first and removed only after the new one is in place, so at every
    moment either the old or the new folder is complete.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{_TAG}{uuid.uuid4().hex[:8]}.tmp")
    tmp.mkdir()
    try:
        yield tmp
        readable_by_others(tmp)
        replace_path(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def replace_path(new: Path, target: Path) -> None:
    """Move `new` (a file or folder) to `target`, replacing whatever is there."""
    if target.is_dir() and not target.is_symlink():
        old = target.with_name(f".{target.name}.{_TAG}{uuid.uuid4().hex[:8]}.old")
        os.replace(target, old)
        os.replace(new, target)
        shutil.rmtree(old, ignore_errors=True)
    else:
        if target.exists() and new.is_dir():
            target.unlink()
        os.replace(new, target)


_umask_lock = threading.Lock()


def current_umask() -> int:
    """The process's umask. Linux reports it; elsewhere it can only be read by setting it, briefly and to the
    stricter 077 so that a file another thread creates meanwhile is never more open than intended."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    with _umask_lock:
        mask = os.umask(0o077)
        os.umask(mask)
    return mask


def readable_by_others(path: Path) -> None:
    """Give a written file, or a folder and everything in it, the modes the umask gives new files and folders."""
    if os.name == "nt" or not path.exists():  # Windows has no such modes; a writer may have written nothing
        return
    mask = current_umask()
    file_mode, folder_mode = 0o666 & ~mask, 0o777 & ~mask
    if not path.is_dir():
        os.chmod(path, file_mode)
        return
    os.chmod(path, folder_mode)
    for root, folders, files in os.walk(path):
        for names, mode in ((folders, folder_mode), (files, file_mode)):
            for name in names:
                entry = Path(root) / name
                if not entry.is_symlink():  # chmod would change the link's target, which is not ours
                    os.chmod(entry, mode)


def remove_leftovers(folder: str | os.PathLike, recursive: bool = False) -> list[Path]:
    """Delete the temporary files and folders that killed writes left in `folder` (those of processes that no longer
    run); returns what was removed."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    removed = []
    for path in folder.rglob(".*") if recursive else folder.glob(".*"):
        match = _LEFTOVER.match(path.name)
        if not match or _process_running(int(match.group(1))):
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                path.unlink()
        removed.append(path)
    return removed


def _process_running(pid: int) -> bool:
    if pid == os.getpid():
        return True
    if os.name == "nt":
        import ctypes

        handle = ctypes.windll.kernel32.OpenProcess(0x1000, False, pid)  # PROCESS_QUERY_LIMITED_INFORMATION
        if not handle:
            return False
        ctypes.windll.kernel32.CloseHandle(handle)
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True
