"""Fault drills on a real `scripts/train.py` process: signals sent at a logged moment, TensorBoard's child process,
and the checks before any work (`--check`, `--preflight`, in-process where no process is needed)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from PIL import Image

from onetrainer.cli.train import EXIT_ABORTED, EXIT_INVALID, EXIT_OK, main
from onetrainer.training.checkpoint import list_backups
from onetrainer.training.tensorboard import find_free_port
from tests.conftest import ROOT
from tests.helpers import image_folder, tiny_config, write_config

posix_only = pytest.mark.skipif(os.name != "posix", reason="POSIX signals and /proc")


class Trainer:
    """`scripts/train.py` in a subprocess, its stderr collected as it comes (tqdm writes without newlines)."""

    def __init__(self, config_path: Path) -> None:
        self.process = subprocess.Popen(
            [sys.executable, str(ROOT / "scripts" / "train.py"), "--config-path", str(config_path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        self.output = b""
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while chunk := self.process.stdout.read1(4096):
            self.output += chunk

    @property
    def text(self) -> str:
        return self.output.decode(errors="replace")

    def wait_for(self, text: str, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.text:
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"{text!r} never came:\n{self.text}")
            time.sleep(0.05)

    def finish(self, timeout: float = 180) -> int:
        try:
            code = self.process.wait(timeout)
        finally:
            if self.process.poll() is None:
                self.process.kill()
        self._reader.join(10)
        return code


def tensorboard_children(log_dir: Path) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if "tensorboard_child" in cmdline and str(log_dir) in cmdline:
            found.append(int(proc.name))
    return found


def wait_gone(pids: list[int], timeout: float = 20) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not [p for p in pids if Path(f"/proc/{p}").exists() and "Z" not in _state(p)]:
            return True
        time.sleep(0.1)
    return False


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return "Z"


@pytest.mark.slow
@posix_only
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_and_sighup_stop_like_the_stop_button(tmp_path, signum):
    image_folder(tmp_path)
    tensorboard = signum == signal.SIGTERM  # one drill checks that the TensorBoard child ends with the run
    config = tiny_config(
        tmp_path, epochs=200, backup_before_save=True, tensorboard=tensorboard, tensorboard_port=find_free_port(17006)
    )
    trainer = Trainer(write_config(tmp_path, config))
    if tensorboard:
        trainer.wait_for("TensorBoard: http")
    trainer.wait_for("loss=")  # a step is done
    children = tensorboard_children(tmp_path / "workspace" / "tensorboard") if tensorboard else []
    assert children or not tensorboard
    trainer.process.send_signal(signum)
    code = trainer.finish()
    output = Path(config["output_model_destination"])
    assert code == EXIT_OK, trainer.text
    assert f"{signum.name}: stopping after this step" in trainer.text
    assert f"Finished (stopped): {output}" in trainer.text and output.is_file()
    assert list_backups(tmp_path / "workspace" / "backup")
    assert "Traceback" not in trainer.text
    assert wait_gone(children, 10), "the TensorBoard child outlived the run"


@pytest.mark.slow
@posix_only
def test_a_second_ctrl_c_aborts_promptly_with_one_line(tmp_path):
    image_folder(tmp_path)
    # A fine-tune backs up and saves whole diffusers folders: slow enough to press Ctrl+C again meanwhile.
    config = tiny_config(
        tmp_path, method="FINE_TUNE", epochs=200, learning_rate=1e-4, backup_before_save=True,
        output_model_format="DIFFUSERS", output_model_destination=str(tmp_path / "out" / "model"),
    )  # fmt: skip
    trainer = Trainer(write_config(tmp_path, config))
    trainer.wait_for("loss=")
    trainer.process.send_signal(signal.SIGINT)
    trainer.wait_for("SIGINT: stopping after this step")
    trainer.wait_for("writing a backup")
    trainer.process.send_signal(signal.SIGINT)
    code = trainer.finish()
    assert code == EXIT_ABORTED, trainer.text  # during the backup: it was neither finished nor the model saved
    assert "Training aborted: aborted by a second interrupt" in trainer.text and "Traceback" not in trainer.text
    [log] = (tmp_path / "workspace" / "logs").glob("*.log")
    assert (
        "Training failed: aborted by a second interrupt (Ctrl+C)" in log.read_text()
        and "Traceback" not in log.read_text()
    )
    assert not Path(config["output_model_destination"]).exists()  # nothing half-written
    assert not [p for p in (tmp_path / "workspace" / "backup").iterdir() if p.name.startswith(".")]


@pytest.mark.slow
@posix_only
def test_the_tensorboard_child_ends_when_its_parent_is_killed(tmp_path):
    script = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from onetrainer.training.tensorboard import TensorBoardServer, find_free_port\n"
        f"server = TensorBoardServer(Path({str(tmp_path)!r}), find_free_port(18006))\n"
        "print(server.start(), flush=True)\n"
        "time.sleep(600)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert "TensorBoard: http" in parent.stdout.readline()
        deadline = time.monotonic() + 30
        while not (children := tensorboard_children(tmp_path)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert children
        parent.kill()  # SIGKILL: no handler, no cleanup in the parent
        parent.wait(10)
        assert wait_gone(children), "the TensorBoard child outlived a killed parent"
    finally:
        if parent.poll() is None:
            parent.kill()


def test_a_tensorboard_server_that_cannot_bind_says_why(tmp_path):
    import socket

    from onetrainer.training.tensorboard import TensorBoardServer

    server = TensorBoardServer(tmp_path, find_free_port(19006), output_path=tmp_path / "tb.log")
    with socket.socket() as taken:
        server.start()
        taken.bind(("127.0.0.1", server.port))  # another run's server got there first
        taken.listen()
        try:
            deadline = time.monotonic() + 120
            while server.failure() is None and time.monotonic() < deadline:
                time.sleep(0.2)
            failure = server.failure()
        finally:
            server.stop()
    assert failure is not None and f"TensorBoard on port {server.port} stopped" in failure
    assert "in use" in failure, failure  # TensorBoard's own words, from its output


def test_check_refuses_an_output_location_that_cannot_be_written(in_tmp, capsys):
    image_folder(in_tmp)
    (in_tmp / "models").write_text("a file, not a folder")
    config = tiny_config(in_tmp, output_model_destination=str(in_tmp / "models" / "lora.safetensors"))
    code = main(["--config-path", str(write_config(in_tmp, config)), "--check"])
    err = capsys.readouterr().err
    assert code == EXIT_INVALID
    assert "output_model_destination" in err and f"{in_tmp / 'models'} is a file" in err


def test_preflight_skips_an_image_above_the_pixel_limit_and_warns_about_odd_files(in_tmp, capsys, monkeypatch):
    folder = image_folder(in_tmp)
    Image.new("RGB", (120, 120), "red").save(folder / "huge.png")
    Image.new("RGB", (1, 1), "red").save(folder / "dot.png")
    Image.new("RGB", (72, 72), "blue").save(folder / "long.png")
    (folder / "long.txt").write_text("word " * 40_000)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 6_000)  # 120x120 is above twice the limit; 72x72 is below
    config = write_config(in_tmp, tiny_config(in_tmp))
    assert main(["--config-path", str(config), "--preflight"]) == EXIT_OK
    out = capsys.readouterr().out
    assert f"unreadable, skipped: {folder / 'huge.png'}" in out and "Pillow's limit" in out
    assert f"warning: {folder / 'dot.png'} is only 1x1 pixels" in out
    assert f"warning: {folder / 'long.txt'} is 200,000 bytes long" in out
    assert "Traceback" not in out


def test_include_train_config_is_no_longer_reported_as_missing(in_tmp, capsys):
    image_folder(in_tmp)
    config = write_config(in_tmp, tiny_config(in_tmp, include_train_config="ALL"))
    assert main(["--config-path", str(config), "--check"]) == EXIT_OK
    assert "include_train_config" not in capsys.readouterr().err
    json.loads(config.read_text())  # the config file itself is untouched
