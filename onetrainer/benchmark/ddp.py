"""Images per second at a fixed per-GPU batch with 1 and with N training processes (issue 15's goal: ≥ 1.8× on 2 GPUs).

Both go through `run_training` on the tiny SD 1.5 model with the demo preset's settings, as the app's Start does: the
N-process run is `multi_gpu` with `device_indexes` 0 … N-1, so this process is rank 0 and the others are
`rank_worker` children (`training/launcher.py`), NCCL on CUDA, gloo on a CPU. Each run is timed from rank 0's
`Metrics` events after `warmup` steps (the ranks move in step: every step ends with their sync), so model loading,
caching and process start-up are not counted. On a CPU the processes share the cores (each rank gets cores − 1
divided by N threads; the one-process run gets the same count, so the figure is the scaling of the data-parallel
code, not of a bigger thread pool).
"""

from __future__ import annotations

import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

GOAL_SPEEDUP_2_GPUS = 1.8


@dataclass(frozen=True)
class DdpRun:
    processes: int
    batch_per_process: int
    steps: int
    seconds: float

    @property
    def images_per_second(self) -> float:
        return self.steps * self.batch_per_process * self.processes / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class DdpResult:
    device: str
    resolution: str
    one: DdpRun
    many: DdpRun

    @property
    def speedup(self) -> float:
        return self.many.images_per_second / self.one.images_per_second if self.one.images_per_second else 0.0

    def to_dict(self) -> dict:
        return {
            "device": self.device,
            "resolution": self.resolution,
            "speedup": self.speedup,
            "runs": [{**asdict(run), "images_per_second": run.images_per_second} for run in (self.one, self.many)],
        }


def _write_images(folder: Path, count: int) -> Path:
    """`count` captioned images of one size (one bucket: every step is a full batch)."""
    import numpy as np
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(count):
        pixels = np.clip(rng.integers(0, 256, size=(1, 1, 3)) + rng.integers(-40, 40, size=(96, 96, 3)), 0, 255)
        Image.fromarray(pixels.astype(np.uint8)).save(folder / f"image-{i:04d}.png")
        (folder / f"image-{i:04d}.txt").write_text(f"a picture number {i}", encoding="utf-8")
    return folder


def time_processes(
    processes: int, root: Path, device: torch.device, batch_size: int, steps: int, warmup: int
) -> tuple[DdpRun, str]:
    from onetrainer.benchmark.overhead import _StepClock, demo_config
    from onetrainer.training.control import TrainingControl
    from onetrainer.training.devices import torch_threads, training_threads
    from onetrainer.training.events import Failed
    from onetrainer.training.runner import run_training

    name = f"{processes}-processes"
    images = _write_images(root / name / "images", 4 * batch_size * processes)
    extra = [f"batch_size={batch_size}", "epochs=1000", "dataloader_threads=0"]
    if processes > 1:
        extra += ["multi_gpu=true", "device_indexes=" + ",".join(str(i) for i in range(processes))]
    output = root / name / "out" / "lora.safetensors"
    config = demo_config(images, root / name / "workspace", root / name / "cache", output, device, *extra)
    control = TrainingControl()
    clock = _StepClock(control, warmup + steps)
    # The launcher gives each CPU rank cores − 1 divided by N threads; one process gets the same.
    threads = training_threads() if device.type == "cuda" else max(1, training_threads() // max(processes, 2))
    with torch_threads(threads):
        outcome = run_training(config, control, [clock])
    if isinstance(outcome, Failed):
        raise RuntimeError(f"the {processes}-process run failed: {outcome.message}\n{outcome.traceback}")
    if len(clock.times) < warmup + steps:
        raise RuntimeError(f"the {processes}-process run ended after {len(clock.times)} steps")
    seconds = clock.times[warmup + steps - 1] - clock.times[warmup - 1]
    return DdpRun(processes, batch_size, steps, seconds), config.resolution


def measure_ddp(
    processes: int = 2, steps: int = 10, warmup: int = 2, batch_size: int = 2, device: torch.device | None = None
) -> DdpResult:
    """One process, then `processes` processes, at `batch_size` per process."""
    device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
    with tempfile.TemporaryDirectory(prefix="onetrainer-benchmark-ddp-") as tmp:
        one, resolution = time_processes(1, Path(tmp), device, batch_size, steps, warmup)
        many, _ = time_processes(processes, Path(tmp), device, batch_size, steps, warmup)
    return DdpResult(str(device), resolution, one, many)


def format_ddp(result: DdpResult) -> str:
    lines = [
        f"tiny SD 1.5 LoRA, demo preset ({result.resolution} px), {result.device}, "
        f"batch {result.one.batch_per_process} per process, {result.one.steps} timed steps"
    ]
    for run in (result.one, result.many):
        word = "process" if run.processes == 1 else "processes"
        lines.append(f"  {run.processes} {word}: {run.images_per_second:.2f} images/s ({run.seconds:.2f} s)")
    goal = ""
    if result.many.processes == 2 and result.device.startswith("cuda"):
        verdict = "met" if result.speedup >= GOAL_SPEEDUP_2_GPUS else "NOT met"
        goal = f" (goal on 2 GPUs ≥ {GOAL_SPEEDUP_2_GPUS}: {verdict})"
    lines.append(f"  speed-up: {result.speedup:.2f}×{goal}")
    return "\n".join(lines)
