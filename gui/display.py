"""A display for Tk where there is none: an Xvfb started on a free display number (GUI tests, `benchmark.py --gui`)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Iterator

XVFB_SCREEN = "1600x1000x24"


class NoDisplayError(RuntimeError):
    """No DISPLAY is set and no Xvfb could be started; the message says why and what to install."""


def start_xvfb(binary: str, screen: str = XVFB_SCREEN) -> tuple[subprocess.Popen, str]:
    """Start Xvfb on a free display number (Xvfb picks it and reports it through -displayfd)."""
    read_fd, write_fd = os.pipe()
    process = subprocess.Popen(
        [binary, "-displayfd", str(write_fd), "-screen", "0", screen, "-nolisten", "tcp"],
        pass_fds=(write_fd,),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    os.close(write_fd)
    data = b""
    deadline = time.monotonic() + 20
    while not data.endswith(b"\n") and time.monotonic() < deadline:
        chunk = os.read(read_fd, 32)
        if not chunk:
            break
        data += chunk
    os.close(read_fd)
    number = data.strip().decode()
    if not number.isdigit():
        process.terminate()
        raise RuntimeError("Xvfb did not report a display number")
    return process, f":{number}"


@contextlib.contextmanager
def display() -> Iterator[str]:
    """$DISPLAY when set; else an Xvfb for the duration (DISPLAY set meanwhile); else NoDisplayError."""
    existing = os.environ.get("DISPLAY")
    if existing:
        yield existing
        return
    binary = shutil.which("Xvfb")
    if binary is None:
        raise NoDisplayError("no display and Xvfb is not installed (apt-get install xvfb, or set DISPLAY)")
    try:
        process, name = start_xvfb(binary)
    except (OSError, RuntimeError) as e:
        raise NoDisplayError(f"no display and Xvfb could not start ({e})") from e
    os.environ["DISPLAY"] = name
    try:
        yield name
    finally:
        os.environ.pop("DISPLAY", None)
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
