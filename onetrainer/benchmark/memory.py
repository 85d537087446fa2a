"""Peak memory of a block of work: CUDA's allocator peak on a GPU, the resident set size (RSS) on a CPU.

tracemalloc does not see torch's allocations, and `ru_maxrss` only ever grows over the whole process, so on a CPU
each piece of work runs once more in a fresh process: with the libraries imported, it restarts the kernel's peak-RSS
count and trains, and its peak is that work's own. The benchmark process's `ru_maxrss` is reported beside it,
labelled as process-wide.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path
from types import TracebackType

import torch

GIB = 1024**3


def format_gib(n: int | None) -> str:
    return "n/a" if n is None else f"{n / GIB:.2f} GiB"


def process_peak_rss() -> int:
    """The whole process's peak RSS in bytes since it started (`ru_maxrss`: KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024


def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def current_rss() -> int | None:
    """The RSS now, in bytes (Linux); None where /proc does not tell."""
    return _status_kib("VmRSS")


def reset_peak_rss() -> bool:
    """Restart the kernel's peak-RSS count (VmHWM) from the current RSS (Linux >= 4.0); False where unsupported.

    A process's import of torch and friends peaks higher than a tiny model's training ever goes, so without the
    reset the peak would only show the imports.
    """
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
        return _status_kib("VmHWM") is not None
    except OSError:
        return False


def peak_rss_since_reset() -> int | None:
    """The peak RSS (VmHWM) in bytes since the last `reset_peak_rss` (or the process start)."""
    return _status_kib("VmHWM")


class PeakMemory:
    """`with PeakMemory(device) as m: ...` then `m.peak_bytes`: CUDA's allocator peak over the block, else None.

    `reserved_bytes` is the allocator's reserved peak, closer to what nvidia-smi shows (both leave out the CUDA
    context). A CPU has no such counter: a thread sampling the RSS would disturb the very timing being measured (its
    GIL hand-offs cost milliseconds on a busy 2-core machine), so CPU peaks come from `probe_peak_rss` instead.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.peak_bytes: int | None = None
        self.reserved_bytes: int | None = None

    def __enter__(self) -> PeakMemory:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            # Blocks cached from earlier work (an fp32 init before a cast, say) would count as reserved otherwise.
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak_bytes = torch.cuda.max_memory_allocated(self.device)
            self.reserved_bytes = torch.cuda.max_memory_reserved(self.device)


def probe_peak_rss(code: str, timeout: float = 600) -> dict:
    """Run `code` in a fresh Python process and return the JSON object it prints on its last line.

    `ru_maxrss` only ever grows over a process's life, so the only clean peak of one piece of work is that of a
    process doing nothing else. The child inherits the environment (the cache folders) and finds this checkout.
    """
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=timeout, check=False
    )
    lines = result.stdout.strip().splitlines()
    if result.returncode != 0 or not lines:
        raise RuntimeError(f"the memory probe failed ({result.returncode}):\n{result.stderr[-3000:]}")
    return json.loads(lines[-1])
