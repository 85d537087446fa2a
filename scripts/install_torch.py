#!/usr/bin/env python3
"""Install the pinned torch build that matches this machine (CUDA or CPU) into a Python environment.

Standard library only: it runs before the package (and maybe before the virtual environment) exists.

    python scripts/install_torch.py --python .venv/bin/python            # install (or skip if already there)
    python scripts/install_torch.py --python .venv/bin/python --dry-run  # print the pip command only

Choice:
  * NVIDIA driver found (``nvidia-smi`` reports "CUDA Version: X.Y"): the newest CUDA build from
    https://download.pytorch.org/whl/cuXXX that the driver supports (see CUDA_VARIANTS); a driver
    too old for all of them falls back to the CPU build, with a message.
  * otherwise on Linux/Windows: the CPU build (``--extra-index-url https://download.pytorch.org/whl/cpu``;
    PyPI's Linux torch wheels are the large CUDA builds); on macOS: plain ``torch`` from PyPI (MPS/CPU).

Overrides (environment):
  ONETRAINER_TORCH=cpu|cuda|cuXXX   force the CPU build, a CUDA build (the newest one the driver supports,
                                    else the oldest in the table), or one exact CUDA variant
  ONETRAINER_TORCH_INDEX=URL        install torch from this index (``--index-url URL``) whatever the hardware
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlparse

TORCH_VERSION = "2.13.0"
TORCH_REQUIREMENT = f"torch=={TORCH_VERSION}"
INDEX_BASE = "https://download.pytorch.org/whl"
CPU_INDEX = f"{INDEX_BASE}/cpu"

# (variant, minimum driver CUDA version), newest first. A CUDA build needs a driver whose "CUDA Version"
# (the newest CUDA runtime the driver supports, as printed by nvidia-smi) is at least the build's version.
CUDA_VARIANTS: tuple[tuple[str, tuple[int, int]], ...] = (
    ("cu130", (13, 0)),
    ("cu128", (12, 8)),
    ("cu126", (12, 6)),
)

_CUDA_VERSION_RE = re.compile(r"CUDA Version\s*:\s*(\d+)\.(\d+)")


@dataclass(frozen=True)
class TorchChoice:
    """What to install: ``pip install <pip_args>``, and why."""

    variant: str  # "cpu", "cu128", ... or "default" (PyPI's own build: macOS, or a forced index)
    pip_args: tuple[str, ...]  # arguments after "pip install"
    reason: str  # one human-readable line
    warning: str | None = None  # printed prominently (e.g. a CUDA driver too old: CPU fallback)

    @property
    def index_url(self) -> str | None:
        for flag in ("--index-url", "--extra-index-url"):
            if flag in self.pip_args:
                return self.pip_args[self.pip_args.index(flag) + 1]
        return None


def normalize_platform(platform: str) -> str:
    """``sys.platform`` (or a friendly name) -> "linux", "windows" or "macos"."""
    p = platform.lower()
    if p.startswith("win") or p == "cygwin":
        return "windows"
    if p.startswith("darwin") or p.startswith("mac"):
        return "macos"
    return "linux"


def parse_driver_cuda_version(nvidia_smi_output: str | None) -> tuple[int, int] | None:
    """The "CUDA Version: X.Y" from nvidia-smi's header, or None (no output, no GPU, "N/A", ...)."""
    if not nvidia_smi_output:
        return None
    match = _CUDA_VERSION_RE.search(nvidia_smi_output)
    if match is None:
        return None
    return int(match.group(1)), int(match.group(2))


def _fmt(version: tuple[int, int]) -> str:
    return f"{version[0]}.{version[1]}"


def _cpu_choice(os_name: str, reason: str, warning: str | None = None) -> TorchChoice:
    if os_name == "macos":
        return TorchChoice("default", (TORCH_REQUIREMENT,), reason, warning)
    return TorchChoice("cpu", (TORCH_REQUIREMENT, "--extra-index-url", CPU_INDEX), reason, warning)


def _cuda_choice(variant: str, reason: str, warning: str | None = None) -> TorchChoice:
    return TorchChoice(variant, (TORCH_REQUIREMENT, "--index-url", f"{INDEX_BASE}/{variant}"), reason, warning)


def choose_torch(platform: str, nvidia_smi_output: str | None, env: Mapping[str, str]) -> TorchChoice:
    """Decide which torch build to install. Pure: no I/O.

    platform: ``sys.platform`` ("linux", "win32", "darwin").
    nvidia_smi_output: stdout of ``nvidia-smi``, or None when it is missing or failed.
    env: the environment (for ONETRAINER_TORCH / ONETRAINER_TORCH_INDEX).
    """
    os_name = normalize_platform(platform)
    forced_index = (env.get("ONETRAINER_TORCH_INDEX") or "").strip()
    forced = (env.get("ONETRAINER_TORCH") or "").strip().lower()

    if forced_index:
        return TorchChoice(
            "default",
            (TORCH_REQUIREMENT, "--index-url", forced_index),
            f"index forced by ONETRAINER_TORCH_INDEX={forced_index}",
        )

    if forced not in ("", "auto", "cpu", "cuda") and forced not in dict(CUDA_VARIANTS):
        known = ", ".join(["cpu", "cuda", *dict(CUDA_VARIANTS)])
        raise ValueError(f"ONETRAINER_TORCH={forced!r} is not understood (use one of: {known})")

    if forced == "cpu":
        return _cpu_choice(os_name, "CPU build forced by ONETRAINER_TORCH=cpu")

    if os_name == "macos":
        warning = None
        if forced.startswith("cu"):
            warning = f"ONETRAINER_TORCH={forced} ignored: there are no CUDA builds of torch for macOS"
        return _cpu_choice(os_name, "macOS: the PyPI build (Apple-silicon GPU via MPS, or CPU)", warning)

    driver = parse_driver_cuda_version(nvidia_smi_output)

    if forced in dict(CUDA_VARIANTS):
        return _cuda_choice(forced, f"CUDA build {forced} forced by ONETRAINER_TORCH={forced}")

    if forced == "cuda":
        for variant, needed in CUDA_VARIANTS:
            if driver is not None and driver >= needed:
                return _cuda_choice(
                    variant, f"CUDA build forced by ONETRAINER_TORCH=cuda; driver supports CUDA {_fmt(driver)}"
                )
        oldest = CUDA_VARIANTS[-1][0]
        seen = f"driver supports CUDA {_fmt(driver)}" if driver else "no NVIDIA driver detected"
        return _cuda_choice(oldest, f"CUDA build forced by ONETRAINER_TORCH=cuda ({seen}): using {oldest}")

    if driver is None:
        if nvidia_smi_output and "NVIDIA-SMI" in nvidia_smi_output:
            return _cpu_choice(
                os_name,
                "CPU build: nvidia-smi ran but reported no CUDA version",
                "nvidia-smi did not report a CUDA version; installing the CPU build "
                "(set ONETRAINER_TORCH=cuda to force a CUDA build)",
            )
        return _cpu_choice(os_name, "CPU build: no NVIDIA GPU/driver found, nvidia-smi missing or failed")

    for variant, needed in CUDA_VARIANTS:
        if driver >= needed:
            return _cuda_choice(variant, f"CUDA build {variant}: the NVIDIA driver supports CUDA {_fmt(driver)}")

    oldest_variant, oldest_needed = CUDA_VARIANTS[-1]
    return _cpu_choice(
        os_name,
        f"CPU build: the NVIDIA driver (CUDA {_fmt(driver)}) is too old for torch {TORCH_VERSION}'s CUDA builds",
        f"Your NVIDIA driver supports CUDA {_fmt(driver)}, but torch {TORCH_VERSION}'s oldest CUDA build "
        f"({oldest_variant}) needs CUDA >= {_fmt(oldest_needed)}. Installing the CPU build: training will be "
        "very slow. Update the NVIDIA driver and run the installer again (or set ONETRAINER_TORCH=cuda to try "
        f"{oldest_variant} anyway).",
    )


def installed_matches(installed_version: str | None, choice: TorchChoice) -> bool:
    """Whether an installed torch (its version string, e.g. "2.13.0+cpu", or None) already fits the choice.

    The public version must equal the pin. A CPU build ("+cpu") does not fit a CUDA choice (it would leave the
    GPU unused), so it gets replaced; otherwise any build of the pinned version is kept.
    """
    if not installed_version:
        return False
    public, _, local = installed_version.strip().partition("+")
    if public != TORCH_VERSION:
        return False
    return not (choice.variant.startswith("cu") and local == "cpu")


def drop_unreachable_index(choice: TorchChoice, index_reachable: bool) -> TorchChoice:
    """Without access to download.pytorch.org, the CPU *extra* index can be dropped: pip then takes torch from
    the configured indexes (PyPI, a mirror, find-links). A CUDA or forced index is required, so it is kept."""
    if index_reachable or "--extra-index-url" not in choice.pip_args:
        return choice
    i = choice.pip_args.index("--extra-index-url")
    args = choice.pip_args[:i] + choice.pip_args[i + 2 :]
    note = (
        f"{urlparse(choice.index_url or '').hostname} cannot be resolved: installing {TORCH_REQUIREMENT} from the "
        "configured pip indexes and find-links only (where that is PyPI, on Linux, it is the larger CUDA build)"
    )
    return TorchChoice(choice.variant, args, choice.reason, note)


# ---------------------------------------------------------------------------------------------------------------
# I/O


def run_nvidia_smi() -> str | None:
    """nvidia-smi's output, or None when there is no nvidia-smi, it fails, or it finds no GPU."""
    exe = shutil.which("nvidia-smi")
    if exe is None and sys.platform == "win32":
        fallback = os.path.join(
            os.environ.get("PROGRAMFILES", r"C:\Program Files"), "NVIDIA Corporation", "NVSMI", "nvidia-smi.exe"
        )
        exe = fallback if os.path.isfile(fallback) else None
    if exe is None:
        return None
    try:
        proc = subprocess.run([exe], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    if proc.returncode != 0:
        return None
    return proc.stdout


def installed_torch_version(python: str) -> str | None:
    """The torch version installed in the target interpreter (asked inside it), or None."""
    code = (
        "import importlib.metadata as m\ntry:\n    print(m.version('torch'))\nexcept m.PackageNotFoundError:\n    pass"
    )
    try:
        proc = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    except OSError as exc:
        raise SystemExit(f"error: cannot run the target Python {python!r}: {exc}") from exc
    if proc.returncode != 0:
        raise SystemExit(f"error: the target Python {python!r} failed:\n{proc.stderr.strip()}")
    return proc.stdout.strip() or None


def _host_resolves(url: str | None) -> bool:
    host = urlparse(url or "").hostname
    if not host:
        return True
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return True  # behind a proxy, local DNS says nothing about reachability
    old = socket.getdefaulttimeout()
    socket.setdefaulttimeout(5)
    try:
        socket.getaddrinfo(host, 443)
        return True
    except OSError:
        return False
    finally:
        socket.setdefaulttimeout(old)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=f"Install torch {TORCH_VERSION} (CUDA or CPU build, as fits).")
    parser.add_argument("--python", default=sys.executable, help="interpreter to install into (default: this one)")
    parser.add_argument("--dry-run", action="store_true", help="print the decision and pip command, run nothing")
    args = parser.parse_args(argv)

    try:
        choice = choose_torch(sys.platform, run_nvidia_smi(), os.environ)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    installed = installed_torch_version(args.python)
    if installed_matches(installed, choice):
        print(f"torch {installed} is already installed; nothing to do. Wanted: {choice.reason}")
        return 0

    if "--extra-index-url" in choice.pip_args:
        choice = drop_unreachable_index(choice, _host_resolves(choice.index_url))
    print(f"torch {TORCH_VERSION}: {choice.reason}")
    if choice.warning:
        print(f"NOTE: {choice.warning}")

    pip_args = list(choice.pip_args)
    if installed:
        print(f"replacing the installed torch {installed}")
        if installed.partition("+")[0] == TORCH_VERSION and choice.variant != "default":
            # "torch==X" is already satisfied by another local build of X (e.g. X+cpu): name the build
            pip_args[pip_args.index(TORCH_REQUIREMENT)] = f"{TORCH_REQUIREMENT}+{choice.variant}"
    cmd = [args.python, "-m", "pip", "install", *pip_args]
    if args.dry_run:
        print(shlex.join(cmd))
        return 0
    print(f"$ {shlex.join(cmd)}", flush=True)
    proc = subprocess.run(cmd, check=False)
    if proc.returncode != 0:
        index = choice.index_url
        hint = f" Check that {index} is reachable." if index else ""
        print(
            f"error: installing {TORCH_REQUIREMENT} failed (pip exit code {proc.returncode}).{hint}\n"
            "       Override the choice with ONETRAINER_TORCH=cpu|cuda or ONETRAINER_TORCH_INDEX=URL.",
            file=sys.stderr,
        )
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
