"""TensorBoard: the event sink that writes scalars and samples, and the local server users open in a browser."""

from __future__ import annotations

import contextlib
import logging
import socket
import subprocess
import sys
import time
from pathlib import Path

from onetrainer.training.events import Event, Metrics, SampleReady, Scalars

log = logging.getLogger(__name__)


class TensorBoardSink:
    """Writes `loss/train_step`, `smooth_loss/train_step`, `lr/<group>` and sample images, x-axis = step."""

    def __init__(self, log_dir: Path, samples: bool = True) -> None:
        from torch.utils.tensorboard import SummaryWriter

        log_dir.mkdir(parents=True, exist_ok=True)
        self.writer = SummaryWriter(log_dir=str(log_dir))
        self.samples = samples

    def emit(self, event: Event) -> None:
        if isinstance(event, Metrics):
            self.writer.add_scalar("loss/train_step", event.loss, event.global_step)
            self.writer.add_scalar("smooth_loss/train_step", event.smooth_loss, event.global_step)
            for name, value in event.learning_rates.items():
                self.writer.add_scalar(f"lr/{name}", value, event.global_step)
            for name, value in event.extra.items():
                self.writer.add_scalar(name, value, event.global_step)
        elif isinstance(event, Scalars):
            for name, value in event.values.items():
                self.writer.add_scalar(name, value, event.global_step)
        elif isinstance(event, SampleReady) and self.samples:
            self._add_image(event)

    def _add_image(self, event: SampleReady) -> None:
        import numpy as np
        from PIL import Image

        with Image.open(event.path) as image:
            array = np.asarray(image.convert("RGB"))
        self.writer.add_image(f"sample/{event.index} - {event.prompt}", array, event.global_step, dataformats="HWC")

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.flush()
        self.writer.close()


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def find_free_port(start: int, host: str = "127.0.0.1", attempts: int = 100) -> int:
    for port in range(start, min(start + attempts, 65536)):
        if port_is_free(port, host):
            return port
    raise RuntimeError(f"no free port for TensorBoard between {start} and {start + attempts - 1}")


class TensorBoardServer:
    """A `tensorboard` process serving a log directory on 127.0.0.1 (or all interfaces when exposed).

    The process never outlives ours: it runs under `tensorboard_child.py`, which ends it when the
    pipe from this process closes (also when this process is killed). It has a session of its own, so a Ctrl+C in
    the terminal does not end it before the run has saved; the run stops it. Its output goes to `output_path` (when
    given), so a server that dies can say why.
    """

    def __init__(self, log_dir: Path, port: int, expose: bool = False, output_path: Path | None = None) -> None:
        self.log_dir = Path(log_dir)
        self.requested_port = port
        self.expose = expose
        self.output_path = output_path
        self.port: int | None = None
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://localhost:{self.port}/"

    def start(self, wait_seconds: float = 0.0) -> str:
        """Start the server on the requested port or the next free one; returns a line saying where it runs."""
        host = "0.0.0.0" if self.expose else "127.0.0.1"
        self.port = find_free_port(self.requested_port, host)
        args = [
            sys.executable,
            str(Path(__file__).with_name("tensorboard_child.py")),
            "--logdir",
            str(self.log_dir),
            "--port",
            str(self.port),
            "--samples_per_plugin=images=100,scalars=10000",
        ]
        args += ["--bind_all"] if self.expose else ["--host", "127.0.0.1"]
        output = subprocess.DEVNULL
        if self.output_path is not None:
            self.output_path.parent.mkdir(parents=True, exist_ok=True)
            output = self.output_path.open("ab")
        try:
            self.process = subprocess.Popen(
                args, stdin=subprocess.PIPE, stdout=output, stderr=subprocess.STDOUT, start_new_session=True
            )
        finally:
            if output is not subprocess.DEVNULL:
                output.close()
        if wait_seconds:
            self.wait_until_serving(wait_seconds)
        moved = "" if self.port == self.requested_port else f" (port {self.requested_port} was busy)"
        return f"TensorBoard: {self.url}{moved}"

    def wait_until_serving(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                return False
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                return True
            time.sleep(0.2)
        return False

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def failure(self) -> str | None:
        """Why the server has ended on its own (its last output line), or None while it runs or was never started."""
        if self.process is None or self.process.poll() is None:
            return None
        last = ""
        if self.output_path is not None and self.output_path.is_file():
            lines = [ln.strip() for ln in self.output_path.read_text(errors="replace").splitlines() if ln.strip()]
            last = lines[-1] if lines else ""
        reason = f": {last}" if last else ""
        return f"TensorBoard on port {self.port} stopped (exit code {self.process.returncode}){reason}"

    def stop(self) -> None:
        if self.process is None:
            return
        with contextlib.suppress(OSError):
            self.process.stdin.close()  # the child's watchdog ends it; terminate below in case it does not
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)
        self.process = None
