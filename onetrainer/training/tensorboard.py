"""TensorBoard: the event sink that writes scalars and samples, and the local server users open in a browser."""

from __future__ import annotations

import collections
import contextlib
import itertools
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from onetrainer.training.events import Event, Metrics, SampleReady, Scalars, Status, Warning_

if TYPE_CHECKING:
    from onetrainer.config import TrainConfig
    from onetrainer.training.events import Broadcast
    from onetrainer.training.workspace import Workspace

log = logging.getLogger(__name__)


_SINK_NUMBERS = itertools.count(1)
WRITE_INTERVAL = 1.0  # seconds between the writes of what was queued (TensorBoard itself reloads every 30 s or so)


class TensorBoardSink:
    """Writes `loss/train_step`, `smooth_loss/train_step`, `lr/<group>` and sample images, x-axis = step, to an event
    file of the run's TensorBoard folder.

    The training loop only queues the events, each with the time it was queued (its record's wall time: TensorBoard's
    relative and wall axes); a thread of the sink's own writes what was queued once a second, in order, straight into
    the file. (torch's `SummaryWriter` hands every record to a thread of its own as it comes: on a
    small model that hand-over costs the loop about 0.5 ms a step.) `flush` and `close` write everything queued."""

    def __init__(self, log_dir: Path, samples: bool = True, written: dict[str, int] | None = None) -> None:
        """`written`: the last step of each tag already in the folder (`written_steps`): a value of a tag at a step
        up to it is not written again (a reattached remote run's events, replayed from its first step)."""
        from tensorboard.summary.writer.record_writer import RecordWriter

        self.written = dict(written or {})

        log_dir.mkdir(parents=True, exist_ok=True)
        # A number of this process's own (not `id(self)`, which a closed sink's successor may get in the same second:
        # the new file would replace the old one, as a reattached run's sink follows the closed one).
        number = next(_SINK_NUMBERS)
        name = f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}.{number:06d}"
        self.path = log_dir / name
        self._records = RecordWriter(self.path.open("wb"))
        self.samples = samples
        self._pending: collections.deque[tuple[float, Event]] = collections.deque()
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._write(self._event(file_version="brain.Event:2"))
        self._records.flush()
        self._thread = threading.Thread(target=self._write_periodically, name="tensorboard-writer", daemon=True)
        self._thread.start()

    def emit(self, event: Event) -> None:
        if isinstance(event, Metrics | Scalars) or (isinstance(event, SampleReady) and self.samples):
            self._pending.append((time.time(), event))

    def flush(self) -> None:
        self._write_pending()

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        self._thread.join()
        self._write_pending()
        self._records.close()

    # -- writing --------------------------------------------------------------------------------------------------

    def _write_periodically(self) -> None:
        while not self._closed.wait(WRITE_INTERVAL):
            self._write_pending()

    def _write_pending(self) -> None:
        with self._lock:
            if self._records.closed:
                return
            wrote = False
            while self._pending:
                queued, event = self._pending.popleft()
                try:
                    for summary in self._summaries(event):
                        self._write(self._event(wall_time=queued, step=event.global_step, summary=summary))
                    wrote = True
                except Exception as e:  # one record that cannot be written must not stop the others
                    log.warning("TensorBoard could not write %s: %s", type(event).__name__, e)
            if wrote:
                self._records.flush()

    def _summaries(self, event: Event) -> list:
        if isinstance(event, Metrics):
            values = {"loss/train_step": event.loss, "smooth_loss/train_step": event.smooth_loss}
            values.update({f"lr/{name}": value for name, value in event.learning_rates.items()})
            values = self._new({**values, **event.extra}, event.global_step)
            return [_scalars(values)] if values else []
        if isinstance(event, Scalars):
            values = self._new(event.values, event.global_step)
            return [_scalars(values)] if values else []
        if isinstance(event, SampleReady):
            tag = _image_tag(event)
            return [self._image(tag, event)] if self._new({tag: 0}, event.global_step) else []
        return []

    def _new(self, values: dict[str, float], step: int) -> dict[str, float]:
        """The values whose tag has no record at `step` or later in the folder yet."""
        return {tag: value for tag, value in values.items() if step > self.written.get(tag, -1)}

    def _image(self, tag: str, event: SampleReady):
        import numpy as np
        from PIL import Image
        from torch.utils.tensorboard.summary import image

        from onetrainer.sampling.clip_files import is_clip

        if is_clip(event.path):
            return _animated_image(tag, Path(event.path))
        with Image.open(event.path) as opened:
            array = np.asarray(opened.convert("RGB"))
        return image(tag, array, dataformats="HWC")

    @staticmethod
    def _event(wall_time: float | None = None, **fields):
        from tensorboard.compat.proto.event_pb2 import Event as EventRecord

        return EventRecord(wall_time=time.time() if wall_time is None else wall_time, **fields)

    def _write(self, record) -> None:
        self._records.write(record.SerializeToString())


TENSORBOARD_CLIP_SIDE = 512  # a clip's animated preview is scaled down to this longest side (a GIF of full-size frames
# would be tens of MB per sample)


def _animated_image(tag: str, path: Path):
    """A sample clip as TensorBoard's image plugin shows a video: an image summary holding an animated GIF (what
    `SummaryWriter.add_video` writes, without the moviepy it needs)."""
    import io

    from PIL import Image
    from tensorboard.compat.proto.summary_pb2 import Summary

    from onetrainer.sampling.clip_files import gif_bytes, read_clip

    data = gif_bytes(read_clip(path), TENSORBOARD_CLIP_SIDE)
    with Image.open(io.BytesIO(data)) as opened:
        width, height = opened.size
    picture = Summary.Image(height=height, width=width, colorspace=3, encoded_image_string=data)
    return Summary(value=[Summary.Value(tag=tag, image=picture)])


def _image_tag(event: SampleReady) -> str:
    return f"sample/{event.index} - {event.prompt}"


def written_steps(log_dir: Path) -> dict[str, int]:
    """The last step of each tag in the event files of `log_dir` ({} when it has none). A file cut short (the app
    ended while it wrote) counts with the records it holds whole."""
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
    from tensorboard.compat.proto.event_pb2 import Event as EventRecord

    last: dict[str, int] = {}
    if not Path(log_dir).is_dir():
        return last
    for path in sorted(Path(log_dir).glob("events.out.tfevents.*")):
        try:
            for raw in RawEventFileLoader(str(path)).Load():
                record = EventRecord.FromString(raw)
                for value in record.summary.value:
                    last[value.tag] = max(last.get(value.tag, -1), record.step)
        except Exception as e:  # an unreadable file: its steps are written again rather than lost
            log.warning("TensorBoard file %s could not be read: %s", path, e)
    return last


def _scalars(values: dict[str, float]):
    from tensorboard.compat.proto.summary_pb2 import Summary

    return Summary(value=[Summary.Value(tag=tag, simple_value=float(value)) for tag, value in values.items()])


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


# This process's servers by the port each was asked for. A server asked for the port of one still running here takes
# that one over when it serves the same folder, else stops it first: the user has one TensorBoard at the port they set,
# not a second on the next port beside one left running (the app's TensorBoard button's server when a run starts its
# own on the same workspace; a run's server kept on, `tensorboard_always_on`, when the next run starts). Servers of
# other processes (another run from the command line) are left alone: the new one moves to the next free port.
_SERVERS: dict[int, TensorBoardServer] = {}
_SERVERS_LOCK = threading.RLock()


class TensorBoardServer:
    """A `tensorboard` process serving a log directory on 127.0.0.1 (or all interfaces when exposed).

    The process never outlives ours: it runs under `tensorboard_child.py`, which ends it when the
    pipe from this process closes (also when this process is killed). It has a session of its own, so a Ctrl+C in
    the terminal does not end it before the run has saved; the run stops it. Its output goes to `output_path` (when
    given), so a server that dies can say why. One server per asked-for port in a process (see `_SERVERS`).
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
        """Start the server on the requested port or the next free one; returns a line saying where it runs. The
        server this process runs on that port already is taken over (same folder) or stopped first (another)."""
        with _SERVERS_LOCK:
            earlier = _SERVERS.get(self.requested_port)
            if earlier is not None and earlier is not self and earlier.running:
                if earlier._serves(self.log_dir, self.expose):
                    self._take_over(earlier)
                    return f"TensorBoard: {self.url} (already running)"
                earlier.stop()
            line = self._spawn()
            _SERVERS[self.requested_port] = self
        if wait_seconds:
            self.wait_until_serving(wait_seconds)
        return line

    def _serves(self, log_dir: Path, expose: bool) -> bool:
        return self.expose == expose and self.log_dir.resolve() == Path(log_dir).resolve()

    def _take_over(self, earlier: TensorBoardServer) -> None:
        """Become the owner of `earlier`'s process (which then owns none: stopping it stops nothing)."""
        self.process, self.port, self.output_path = earlier.process, earlier.port, earlier.output_path
        earlier.process = None
        _SERVERS[self.requested_port] = self

    def _spawn(self) -> str:
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
        with _SERVERS_LOCK:
            if _SERVERS.get(self.requested_port) is self:
                del _SERVERS[self.requested_port]
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


class RunTensorBoard:
    """A run's TensorBoard, rank 0's (`writes`): the event files, and with `tensorboard` on a server that is started
    once more on the next free port when it ends on its own, and stopped with the run unless it is kept on."""

    def __init__(
        self, config: TrainConfig, workspace: Workspace, events: Broadcast, writes: bool, continues: bool = False
    ) -> None:
        """`continues`: the run's events come again from its first step (a reattached remote run): the steps its
        folder has already are not written twice."""
        self.config, self.workspace, self.events, self.writes = config, workspace, events, writes
        self.continues = continues
        self.server: TensorBoardServer | None = None
        self._retried = False

    def start(self) -> None:
        if not self.writes:
            return
        folder = self.workspace.tensorboard_dir
        written = written_steps(folder) if self.continues else None
        self.events.sinks.append(TensorBoardSink(folder, self.config.samples_to_tensorboard, written))
        if self.config.tensorboard:
            self._launch(self.config.tensorboard_port)

    def _launch(self, port: int) -> None:
        output = self.workspace.dir("logs") / f"{self.workspace.run_name}-tensorboard.log"
        server = TensorBoardServer(self.workspace.dir("tensorboard"), port, self.config.tensorboard_expose, output)
        try:
            self.events.emit(Status(server.start()))
            self.server = server
        except (OSError, RuntimeError) as e:
            self.events.emit(Warning_(f"TensorBoard could not start: {e}"))

    def check(self) -> None:
        """A server that ended on its own (another run's server took the port between our check and its start) is
        started once more on the next free port; a second failure is reported with TensorBoard's own words."""
        server = self.server
        failure = server.failure() if server is not None else None
        if failure is None:
            return
        self.server = None
        if self._retried:
            self.events.emit(Warning_(f"{failure}; TensorBoard is not available for this run"))
            return
        self._retried = True
        self.events.emit(Warning_(f"{failure}; starting it on another port"))
        self._launch((server.port or self.config.tensorboard_port) + 1)

    def stop(self) -> None:
        if self.server is not None and not self.config.tensorboard_always_on:
            self.server.stop()
