"""The queue of runs (`onetrainer/training/job_queue.py`): tiny runs one after another, a failure in the middle, a
restart between them, reordering, and the file's atomic, umask-respecting writes."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from onetrainer.config import config_from_dict
from onetrainer.training.job_queue import (
    FAILED,
    FINISHED,
    INTERRUPTED,
    QUEUED,
    RUNNING,
    JobQueue,
    QueueBusy,
    QueueError,
    QueueRunnerLock,
    run_queue,
)
from onetrainer.util.fs import current_umask
from tests.conftest import ROOT
from tests.helpers import image_folder, tiny_config


def config_in(root: Path, **changes):
    """A one-epoch tiny SD 1.5 LoRA, everything under `root` (its own images, workspace and output)."""
    image_folder(root, count=2)
    config, problems = config_from_dict(tiny_config(root, epochs=1, **changes))
    assert [p for p in problems if p.is_error] == []
    return config


@pytest.fixture
def queue(tmp_path) -> JobQueue:
    return JobQueue(tmp_path / "state" / "job-queue.json")


def test_two_runs_train_in_the_order_queued(tmp_path, queue):
    first = queue.add(config_in(tmp_path / "a"), source=str(tmp_path / "a.json"))
    second = queue.add(config_in(tmp_path / "b"))
    assert first.name == "a.json → lora.safetensors" and first.kind == "local"
    started = []
    result = run_queue(queue, on_start=lambda entry, left: started.append((entry.id, left)))
    assert started == [(first.id, 1), (second.id, 0)]
    assert [e.status for e in queue.entries()] == [FINISHED, FINISHED]
    assert [outcome.reason for _, outcome in result.done] == ["completed", "completed"]
    for root in ("a", "b"):
        assert (tmp_path / root / "out" / "lora.safetensors").is_file()
        assert not (tmp_path / root / "workspace" / "training.lock").exists()  # each run held and released its own
    assert not (queue.path.parent / "job-queue.lock").exists()
    assert queue.entries()[0].reason.startswith("completed: ")  # with the output's path


def test_a_failed_run_is_reported_and_the_next_one_runs(tmp_path, queue):
    queue.add(config_in(tmp_path / "a"))
    queue.add(config_in(tmp_path / "b"))
    shutil.rmtree(tmp_path / "a" / "images")  # the first run's concept folder is gone by the time it runs
    result = run_queue(queue)
    first, second = queue.entries()
    assert (first.status, second.status) == (FAILED, FINISHED)
    assert "cannot be trained" in first.reason and str(tmp_path / "a" / "images") in first.reason
    assert [e.id for e in result.failed] == [first.id]
    assert (tmp_path / "b" / "out" / "lora.safetensors").is_file()


def test_the_queue_keeps_the_config_as_it_was_queued(tmp_path, queue):
    config = config_in(tmp_path / "a")
    config.concepts = None  # from its side file, whose content is copied into the entry
    config.concept_file_name = str(tmp_path / "concepts.json")
    (tmp_path / "concepts.json").write_text(json.dumps([{"path": str(tmp_path / "a" / "images")}]), encoding="utf-8")
    entry = queue.add(config)
    config.epochs = 7
    (tmp_path / "concepts.json").write_text("[]", encoding="utf-8")
    stored = queue.entries()[0].config
    assert stored["epochs"] == 1 and stored["concepts"][0]["path"] == str(tmp_path / "a" / "images")
    assert entry.config == stored


def test_reorder_remove_requeue_and_clear(tmp_path, queue):
    ids = [queue.add(config_in(tmp_path / name), name=name).id for name in ("a", "b", "c")]
    queue.move(3, 1)
    assert [e.name for e in queue.entries()] == ["c", "a", "b"]
    queue.move(ids[0][:5], 99)  # by (the start of) its id; beyond the end is the end
    assert [e.name for e in queue.entries()] == ["c", "b", "a"]
    assert queue.remove("2").name == "b"
    assert [e.name for e in queue.entries()] == ["c", "a"]
    with pytest.raises(QueueError, match="there is no entry 5: the queue has 2"):
        queue.remove(5)
    with pytest.raises(QueueError, match="no entry of the queue has the id 'qnope'"):
        queue.move("qnope", 1)
    claimed = queue.claim_next()
    assert claimed.name == "c" and queue.entries()[0].status == RUNNING
    with pytest.raises(QueueError, match="is running: stop it first"):
        queue.remove(1)
    from onetrainer.training.events import Failed

    queue.record(claimed.id, Failed("boom", log_path="/x.log"))
    assert (queue.entries()[0].status, queue.entries()[0].reason) == (FAILED, "boom")
    assert "boom" in queue.entries()[0].line(1) and "log: /x.log" in queue.entries()[0].line(1)
    assert queue.requeue(1).status == QUEUED and queue.waiting()[0].name == "c"
    queue.record(claimed.id, Failed("again"))
    assert queue.clear_done() == 1 and [e.name for e in queue.entries()] == ["a"]


def test_the_file_is_written_atomically_with_the_umask_modes(tmp_path, queue, monkeypatch):
    previous = os.umask(0o002)
    try:
        queue.add(config_in(tmp_path / "a"), name="a")
        mode = stat.S_IMODE(queue.path.stat().st_mode)
        assert mode == 0o666 & ~current_umask() == 0o664
    finally:
        os.umask(previous)
    before = queue.path.read_bytes()
    import onetrainer.util.fs as fs

    def fail_rename(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(fs.os, "replace", fail_rename)
    with pytest.raises(QueueError, match=r"cannot write the queue file .*No space left"):
        queue.add(config_in(tmp_path / "b"), name="b")
    assert queue.path.read_bytes() == before  # the old queue, whole
    # No temporary file left (the edit lock's file stays: it is only ever locked, never written).
    assert sorted(p.name for p in queue.path.parent.iterdir()) == ["job-queue.json", "job-queue.json.edit"]


def test_changes_at_once_lose_nothing(tmp_path, queue):
    """Two writers at once (the app adds while a runner records): each change is made on the file as the other left
    it, under the edit lock, so every entry arrives."""
    config = config_in(tmp_path / "a")
    errors = []

    def add_some(prefix: str) -> None:
        try:
            for index in range(15):
                JobQueue(queue.path).add(config, name=f"{prefix}{index}")
        except Exception as e:  # shown by the assertion below
            errors.append(e)

    threads = [threading.Thread(target=add_some, args=(prefix,)) for prefix in ("x", "y")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert errors == []
    names = [e.name for e in queue.entries()]
    assert sorted(names) == sorted([f"x{i}" for i in range(15)] + [f"y{i}" for i in range(15)])


def test_a_damaged_queue_file_is_named_not_dropped(queue):
    queue.path.parent.mkdir(parents=True)
    queue.path.write_text('{"version": 1, "entries": [{"id": "q1", "name": "x", "config": {}, "status": "later"}]}')
    with pytest.raises(QueueError, match=r"job-queue.json: entry 1: 'status' must be one of queued, running"):
        queue.entries()
    queue.path.write_text("{not json")
    with pytest.raises(QueueError, match=r"job-queue\.json"):
        queue.add(config_from_dict({})[0])
    assert queue.path.read_text() == "{not json"  # left for the user to look at


def test_one_runner_at_a_time(tmp_path, queue):
    queue.add(config_in(tmp_path / "a"))
    held = QueueRunnerLock.acquire(queue)
    try:
        with pytest.raises(QueueBusy, match=rf"is being run by process {os.getpid()}"):
            run_queue(queue)
    finally:
        held.release()
    assert queue.entries()[0].status == QUEUED


def test_a_restart_between_runs_resumes_the_queue(tmp_path):
    """A runner killed (a crash, a reboot) while its second run trains: a new process finds the first run finished,
    the second queued again, and trains it."""
    state = tmp_path / "state"
    env = {**os.environ, "ONETRAINER_STATE_DIR": str(state)}
    for name in ("a", "b"):
        config = config_in(tmp_path / name)
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(config.to_dict()), encoding="utf-8")
        added = _queue_cli(["add", str(path)], env)
        assert added.returncode == 0, added.stderr
    script = ROOT / "scripts" / "job_queue.py"
    runner = subprocess.Popen(
        [sys.executable, str(script), "run"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    queue = JobQueue(state / "job-queue.json")
    deadline = time.monotonic() + 240
    try:
        while [e.status for e in queue.entries()] != [FINISHED, RUNNING]:
            assert runner.poll() is None, f"the runner ended before its second run: {runner.stderr.read()}"
            assert time.monotonic() < deadline, "the first run did not finish in time"
            time.sleep(0.02)
    finally:
        runner.send_signal(signal.SIGKILL)
        runner.wait(30)
        runner.stderr.close()
    first, second = queue.entries()
    assert (first.status, second.status, second.reason) == (FINISHED, QUEUED, INTERRUPTED)
    finished_at = first.ended
    resumed = _queue_cli(["run"], env)
    assert resumed.returncode == 0, resumed.stderr
    assert "Queue: 1 run(s), 0 failed; 0 waiting" in resumed.stderr
    first, second = queue.entries()
    assert (first.status, first.ended) == (FINISHED, finished_at)  # not trained again
    assert second.status == FINISHED and (tmp_path / "b" / "out" / "lora.safetensors").is_file()
    # The killed runner's queue lock (and its run's workspace lock, when it got that far) were taken over and released.
    assert not (state / "job-queue.lock").exists() and not (tmp_path / "b" / "workspace" / "training.lock").exists()


def _queue_cli(args: list[str], env: dict) -> subprocess.CompletedProcess:
    script = ROOT / "scripts" / "job_queue.py"
    return subprocess.run([sys.executable, str(script), *args], env=env, capture_output=True, text=True, timeout=300)
