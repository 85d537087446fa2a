"""The app's Start with `multi_gpu` (and `scripts/train.py` with it, outside torchrun): this process trains as rank 0
and starts ranks 1 … N-1 as child processes (`rank_worker.py`) with torchrun's environment.

Rank 0 in the calling process keeps everything the app already has working: its events go to the caller's sinks
(footer, TensorBoard, Log window), its `TrainingControl` is the window's, and the per-step sync of
`distributed.py` carries Stop / sample / save / backup to the other ranks. The children:

- find rank 0 through MASTER_ADDR / MASTER_PORT (a free local port) and train on `device_indexes`' next GPUs, or on
  the CPU with gloo when there is no CUDA (so two CPU processes test the whole path);
- end when the process that started them ends in any way (their standard input closes, as the TensorBoard child);
- report a failure through the sync (the others end with its message) or, when one dies outright, through its exit
  code and last output line, which replace the transport error rank 0 sees; the run's end waits for them.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from onetrainer.training.distributed import world_size_from_environment
from onetrainer.training.events import Broadcast, Failed, Finished, Warning_
from onetrainer.training.processes import model_split_wanted, planned_world_size, rank_devices

if TYPE_CHECKING:
    from onetrainer.config import TrainConfig
    from onetrainer.training.distributed import Distributed

FAILED_PREFIX = "Training failed: "  # how a rank worker says why it failed (its last line)
CHILD_GRACE_SECONDS = 60  # after rank 0's end, how long the others may take to end on their own
PACKAGE_ROOT = Path(__file__).resolve().parents[2]


def launch_wanted(config: TrainConfig) -> bool:
    """`multi_gpu` outside torchrun: this process starts the others (not for MODEL_SPLIT, which is one process)."""
    return bool(config.multi_gpu) and world_size_from_environment() <= 1 and not model_split_wanted(config)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RankProcess:
    """One child rank: its process, its output file, and why it ended."""

    def __init__(self, rank: int, world: int, port: int, config_path: Path, folder: Path) -> None:
        self.rank = rank
        self.output_path = folder / f"rank{rank}.out"
        env = {
            **os.environ,
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(world),
            "LOCAL_WORLD_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "PYTHONPATH": os.pathsep.join(p for p in (str(PACKAGE_ROOT), os.environ.get("PYTHONPATH", "")) if p),
        }
        self.ready_path = folder / f"rank{rank}.ready"
        command = [sys.executable, "-m", "onetrainer.training.rank_worker", "--config-path", str(config_path)]
        command += ["--ready-path", str(self.ready_path)]
        with self.output_path.open("wb") as output:
            # A session of its own: a Ctrl+C in the app's terminal stops rank 0, which stops the others in step.
            self.process = subprocess.Popen(
                command, stdin=subprocess.PIPE, stdout=output, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )

    @property
    def ready(self) -> bool:
        """It has imported what training needs and read the config: the next thing it does is join the group."""
        return self.ready_path.exists()

    @property
    def exit_code(self) -> int | None:
        return self.process.poll()

    def failure(self) -> str | None:
        """Why this rank failed, in its own words when it said them; None while it runs or after a clean end."""
        code = self.process.poll()
        if code in (None, 0):
            return None
        text = self._text()
        said = text.rfind("\n" + FAILED_PREFIX) + 1 if not text.startswith(FAILED_PREFIX) else 0
        if said > 0 or text.startswith(FAILED_PREFIX):
            return text[said + len(FAILED_PREFIX) :].strip()  # the whole message: it can have several lines
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        how = f"exit code {code}"
        if code < 0:
            with contextlib.suppress(ValueError):
                how = f"killed by {signal.Signals(-code).name}"
        last = f"; its last output: {lines[-1]}" if lines else ""
        return f"the process ended ({how}){last}"

    def _text(self) -> str:
        with contextlib.suppress(OSError):
            return self.output_path.read_text(errors="replace")
        return ""

    def end(self, timeout: float) -> None:
        """Wait up to `timeout` seconds, then close its input (its watchdog ends it), then terminate it."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout)
        with contextlib.suppress(OSError):
            self.process.stdin.close()
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


def run_ranks(
    config: TrainConfig, events: Broadcast, train: Callable[[Distributed], Finished | Failed]
) -> Finished | Failed:
    """Start the other ranks, join them as rank 0, `train`, and wait for them; never raises."""
    from onetrainer.training.checks import check_devices

    problems = check_devices(config)
    if problems:
        return Failed(f"device_indexes: {problems[0].message}")
    world = planned_world_size(config)
    folder = Path(tempfile.mkdtemp(prefix="onetrainer-ranks-"))
    children: list[RankProcess] = []
    try:
        config_path = folder / "config.json"
        config_path.write_text(json.dumps(config.to_dict()), encoding="utf-8")
        port = free_port()
        children = [RankProcess(rank, world, port, config_path, folder) for rank in range(1, world)]
        joined = _join(config, world, port, children)
        if isinstance(joined, Failed):
            return joined
        with _threads_per_rank(config, world), _watch(children):
            outcome = train(joined)
        for child in children:
            child.end(CHILD_GRACE_SECONDS)
        return _outcome(outcome, children, world, events)
    except Exception as e:  # starting a process, writing the config: the run must still end with a message
        return Failed(f"cannot start the training processes: {type(e).__name__}: {e}", traceback.format_exc())
    finally:
        for child in children:
            child.end(0)
        shutil.rmtree(folder, ignore_errors=True)


def _join(config: TrainConfig, world: int, port: int, children: list[RankProcess]) -> Distributed | Failed:
    """Join the group as rank 0 once every child is ready to join (imports done, config read). A child that ends
    before that (a broken environment) ends the run at once with its words: a join it will never make would keep
    rank 0 waiting for the group's timeout, and a join cannot be interrupted."""
    from onetrainer.training.distributed import TIMEOUT_ENV, Distributed

    seconds = float(os.environ.get(TIMEOUT_ENV, "1800"))
    deadline = time.monotonic() + seconds
    while not all(child.ready for child in children):
        for child in children:
            if child.exit_code is not None:
                return Failed(f"rank {child.rank} of {world} failed: {child.failure() or 'it ended before starting'}")
        if time.monotonic() > deadline:
            return Failed(f"the other training processes did not start within {seconds:.0f} s ({TIMEOUT_ENV})")
        time.sleep(0.1)
    # NCCL's default on an error or a timeout tears the process down: here that would be the app. Abort the
    # communicators only, so the run ends with a message (read when the NCCL group is made; unmeasured: no GPU).
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2")
    try:
        return Distributed.join(rank_devices(config), 0, world, 0, f"tcp://127.0.0.1:{port}")
    except Exception as e:
        return Failed(f"cannot join the other training processes: {type(e).__name__}: {e}", traceback.format_exc())


@contextlib.contextmanager
def _watch(children: list[RankProcess]):
    """While rank 0 trains: a child that dies wakes rank 0 from a collective it would otherwise wait in until the
    timeout. gloo notices the closed connection itself; NCCL's communicators are aborted."""
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.5):
            if any(child.exit_code not in (None, 0) for child in children):
                import torch.distributed as torch_dist

                with contextlib.suppress(Exception):  # the group may be ending already
                    if torch_dist.get_backend() == "nccl":
                        torch_dist.distributed_c10d._abort_process_group()
                return

    thread = threading.Thread(target=watch, name="onetrainer-rank-watch", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()


@contextlib.contextmanager
def _threads_per_rank(config: TrainConfig, world: int):
    """CPU ranks share the cores; each GPU rank keeps the caller's threads."""
    if config.train_device.startswith("cuda"):
        yield
        return
    from onetrainer.training.devices import torch_threads, training_threads

    with torch_threads(max(1, training_threads() // world)):
        yield


def _outcome(
    outcome: Finished | Failed, children: list[RankProcess], world: int, events: Broadcast
) -> Finished | Failed:
    """Rank 0's outcome, unless a child's failure explains it better (rank 0 saw only a closed connection)."""
    failures = [(child.rank, child.failure()) for child in children]
    failures = [(rank, message) for rank, message in failures if message is not None]
    if isinstance(outcome, Finished):
        for rank, message in failures:  # rank 0 saved the model; say what happened to the rank that failed
            events.emit(Warning_(f"rank {rank} of {world} ended with a failure after training: {message}"))
        return outcome
    if outcome.message.startswith("rank ") or not failures:
        return outcome  # rank 0's own failure (the others then failed with "rank 0 … failed"), or theirs relayed
    own = [(rank, message) for rank, message in failures if not message.startswith("rank 0 of")]
    if not own:
        return outcome
    rank, message = own[0]
    return Failed(f"rank {rank} of {world} failed: {message}", outcome.traceback, outcome.log_path)
