"""`scripts/job_queue.py` and `train.py --queue`: adding checked configs, the list, moving and removing by position or
id, a headless run with a failure in the middle, and the README's usage text."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from onetrainer.cli import job_queue
from onetrainer.cli import train as train_cli
from onetrainer.training.job_queue import FAILED, FINISHED, QUEUED, STOPPED, JobQueue
from tests.cli.test_train_drills import Trainer, posix_only
from tests.conftest import ROOT
from tests.helpers import image_folder, tiny_config


def config_file(root: Path, **changes) -> Path:
    image_folder(root, count=2)
    path = root / "config.json"
    path.write_text(json.dumps(tiny_config(root, **{"epochs": 1, **changes})), encoding="utf-8")
    return path


def queue_file(tmp_path: Path) -> JobQueue:
    return JobQueue(tmp_path / "queue.json")


def test_add_list_move_remove(tmp_path, capsys):
    queue = queue_file(tmp_path)
    q = ["--queue-file", str(queue.path)]
    for name in ("a", "b", "c"):
        assert job_queue.main([*q, "add", str(config_file(tmp_path / name)), "--name", name]) == 0
    out = capsys.readouterr().out
    assert "Queued as entry 3 (q" in out and "Note:" not in out  # full paths
    assert job_queue.main([*q, "list"]) == 0
    out = capsys.readouterr().out
    assert out.index("1. queued    a") < out.index("2. queued    b") < out.index("3. queued    c")
    assert "3 waiting" in out
    assert job_queue.main([*q, "move", "3", "1"]) == 0
    assert [e.name for e in queue.entries()] == ["c", "a", "b"]
    assert job_queue.main([*q, "remove", queue.entries()[1].id]) == 0
    assert [e.name for e in queue.entries()] == ["c", "b"]
    capsys.readouterr()
    assert job_queue.main([*q, "remove", "7"]) == 1
    assert "error: there is no entry 7: the queue has 2" in capsys.readouterr().err


def test_relative_paths_are_pointed_out(in_tmp, capsys):
    config_file(in_tmp / "a", workspace_dir="workspace/run", concepts=[{"path": "a/images"}])
    assert job_queue.main(["--queue-file", str(in_tmp / "q.json"), "add", "a/config.json"]) == 0
    out = capsys.readouterr().out
    expected = (
        "Note: workspace_dir=workspace/run, concepts.0.path=a/images are relative: the queue's runner resolves them "
        f"in the folder it runs from (this one: {in_tmp})."
    )
    assert expected in out
    assert JobQueue(in_tmp / "q.json").entries()[0].source == str(in_tmp / "a" / "config.json")


def test_an_invalid_config_is_not_queued(tmp_path, capsys):
    queue = queue_file(tmp_path)
    path = config_file(tmp_path, epochs=0)
    assert job_queue.main(["--queue-file", str(queue.path), "add", str(path)]) == 2
    assert "error: Epochs (epochs): 0 is out of range" in capsys.readouterr().err
    assert not queue.path.exists()
    assert job_queue.main(["--queue-file", str(queue.path), "add", str(tmp_path / "missing.json")]) == 2


def test_train_py_queues_with_the_layers_applied(tmp_path, capsys):
    path = config_file(tmp_path)
    assert train_cli.main(["--config-path", str(path), "--set", "lora_rank=8", "--queue"]) == 0
    (entry,) = JobQueue().entries()  # the app's queue (tests keep it in their own state folder)
    assert entry.status == QUEUED and entry.config["lora_rank"] == 8 and entry.source == str(path)
    assert "Queued as entry 1" in capsys.readouterr().out
    assert train_cli.main(["--config-path", str(path), "--queue", "--check"]) == 2
    assert "--queue queues the run instead" in capsys.readouterr().err


def test_run_goes_on_after_a_failure_and_says_so(tmp_path, capsys):
    queue = queue_file(tmp_path)
    q = ["--queue-file", str(queue.path)]
    assert job_queue.main([*q, "add", str(config_file(tmp_path / "a")), "--name", "first"]) == 0
    assert job_queue.main([*q, "add", str(config_file(tmp_path / "b")), "--name", "second"]) == 0
    shutil.rmtree(tmp_path / "a" / "images")
    capsys.readouterr()
    assert job_queue.main([*q, "run"]) == 1
    err = capsys.readouterr().err
    assert "== Queue: first: failed" in err and "== Queue: second: finished (completed: " in err
    assert "Queue: 2 run(s), 1 failed; 0 waiting" in err and "  failed: first (q" in err
    assert [e.status for e in queue.entries()] == [FAILED, FINISHED]
    assert job_queue.main([*q, "run"]) == 0
    assert "No run waits in the queue." in capsys.readouterr().out
    assert job_queue.main([*q, "requeue", "2"]) == 0 and queue.entries()[1].status == QUEUED
    assert job_queue.main([*q, "clear"]) == 0 and [e.name for e in queue.entries()] == ["second"]


def test_readme_shows_the_usage_text():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert job_queue.build_parser().format_help().strip() in readme
    assert train_cli.build_parser().format_help().strip() in readme


def test_the_script_and_python_dash_m_run(tmp_path):
    queue = queue_file(tmp_path)
    script = ROOT / "scripts" / "job_queue.py"
    listed = subprocess.run(
        [sys.executable, str(script), "--queue-file", str(queue.path), "list"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert listed.returncode == 0 and "The queue is empty" in listed.stdout, listed.stderr
    helped = subprocess.run(
        [sys.executable, "-m", "onetrainer", "job-queue", "-h"], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert helped.returncode == 0 and "usage: python -m onetrainer job-queue" in helped.stdout


@pytest.mark.slow
@posix_only
def test_ctrl_c_stops_the_current_run_cleanly_and_leaves_the_rest_queued(tmp_path):
    queue = queue_file(tmp_path)
    q = ["--queue-file", str(queue.path)]
    assert job_queue.main([*q, "add", str(config_file(tmp_path / "long", epochs=200)), "--name", "long"]) == 0
    assert job_queue.main([*q, "add", str(config_file(tmp_path / "next")), "--name", "next"]) == 0
    runner = QueueProcess([*q, "run"])
    runner.wait_for("loss=")  # the first run has trained a step
    runner.process.send_signal(signal.SIGINT)
    code = runner.finish()
    assert code == 0, runner.text
    assert "SIGINT: stopping after this step" in runner.text and "Traceback" not in runner.text
    assert "== Queue: long: stopped (stopped" in runner.text
    assert "Queue: 1 run(s), 0 failed; 1 waiting (stopped on request" in runner.text
    long, waiting = queue.entries()
    assert (long.status, waiting.status) == (STOPPED, QUEUED)
    assert (tmp_path / "long" / "out" / "lora.safetensors").is_file()  # a stopped run saves its model
    assert not (tmp_path / "next" / "workspace").exists()


class QueueProcess(Trainer):
    """`scripts/job_queue.py` in a subprocess, its output collected as `Trainer` collects train.py's."""

    def __init__(self, args: list[str]) -> None:
        self.process = subprocess.Popen(
            [sys.executable, str(ROOT / "scripts" / "job_queue.py"), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        self.output = b""
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
