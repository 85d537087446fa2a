"""One run per workspace: a second run (the window and a CLI, or two CLIs) is refused naming the running one, and a
lock left by a run that died is taken over."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from onetrainer.cli.train import EXIT_FAILED, EXIT_OK, main
from onetrainer.training.workspace import LOCK_NAME, WorkspaceBusy, WorkspaceLock, read_lock
from tests.conftest import ROOT

QUICK = [
    "--preset", "demo", "--set", "epochs=1", "--set", "sample_after_unit=NEVER", "--set", "cache_dir=cache",
    "--set", "output_model_destination=out.safetensors", "--set", "workspace_dir=workspace",
]  # fmt: skip


def dead_pid() -> int:
    """The pid of a process that has ended."""
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


@pytest.mark.slow
def test_a_cli_run_is_refused_while_another_run_holds_the_workspace(in_tmp):
    held = WorkspaceLock.acquire(in_tmp / "workspace")  # this process trains there (as the window would)
    try:
        result = subprocess.run(
            [sys.executable, str(ROOT / "scripts" / "train.py"), *QUICK], capture_output=True, text=True
        )
    finally:
        held.release()
    assert result.returncode == EXIT_FAILED, result.stderr
    expected = (
        f"Cannot start training: another run is training in the workspace {in_tmp / 'workspace'} "
        f"(process {os.getpid()} on {socket.gethostname()}, started {held.holder.started.replace('T', ' ')})"
    )
    assert expected in result.stderr
    assert "Wait for it to finish, stop it, or set another workspace_dir" in result.stderr
    # Nothing of the refused run was written into the running one's folders.
    assert sorted(p.name for p in (in_tmp / "workspace").iterdir()) == []
    assert not (in_tmp / "workspace" / LOCK_NAME).exists()


def test_a_refused_run_says_it_cannot_start_rather_than_that_training_failed(in_tmp, capsys):
    held = WorkspaceLock.acquire(in_tmp / "workspace")  # another run trains there (a second app, a CLI)
    try:
        assert main(QUICK) == EXIT_FAILED
    finally:
        held.release()
    err = capsys.readouterr().err
    assert "Cannot start training: another run is training in the workspace" in err and "Training failed" not in err


def test_the_lock_holds_pid_host_and_start_time_and_is_removed_when_the_run_ends(in_tmp, capsys):
    lock = WorkspaceLock.acquire(in_tmp / "ws")
    data = json.loads((in_tmp / "ws" / LOCK_NAME).read_text())
    assert data["pid"] == os.getpid() and data["host"] == socket.gethostname() and data["started"]
    with pytest.raises(WorkspaceBusy, match=f"process {os.getpid()} on"):
        WorkspaceLock.acquire(in_tmp / "ws")
    lock.release()
    assert not (in_tmp / "ws" / LOCK_NAME).exists()
    # A finished run leaves no lock behind.
    assert main(QUICK) == EXIT_OK
    assert not (in_tmp / "workspace" / LOCK_NAME).exists()


def test_a_dead_runs_lock_is_taken_over_with_a_notice(in_tmp, capsys):
    (in_tmp / "workspace").mkdir()
    stale = {"pid": dead_pid(), "host": socket.gethostname(), "started": "2020-01-01T10:00:00"}
    (in_tmp / "workspace" / LOCK_NAME).write_text(json.dumps(stale))
    assert main(QUICK) == EXIT_OK
    err = capsys.readouterr().err
    assert f"left by a run that is no longer running (process {stale['pid']} on" in err
    assert not (in_tmp / "workspace" / LOCK_NAME).exists()


def test_a_damaged_lock_is_taken_over(in_tmp):
    (in_tmp / "ws").mkdir()
    (in_tmp / "ws" / LOCK_NAME).write_text("{not json")
    lock = WorkspaceLock.acquire(in_tmp / "ws")
    assert lock.taken_over is not None and read_lock(in_tmp / "ws" / LOCK_NAME) == lock.holder
    lock.release()


def test_a_lock_from_another_host_is_refused_naming_the_file_to_delete(in_tmp):
    (in_tmp / "ws").mkdir()
    other = {"pid": dead_pid(), "host": "render-box", "started": "2020-01-01T10:00:00"}
    (in_tmp / "ws" / LOCK_NAME).write_text(json.dumps(other))
    with pytest.raises(WorkspaceBusy) as refused:
        WorkspaceLock.acquire(in_tmp / "ws")
    assert f"process {other['pid']} on render-box" in str(refused.value)
    assert f"delete {in_tmp / 'ws' / LOCK_NAME}" in str(refused.value)


def test_release_leaves_a_lock_that_another_run_took_over(in_tmp):
    lock = WorkspaceLock.acquire(in_tmp / "ws")
    successor = {"pid": 1, "host": socket.gethostname(), "started": "2099-01-01T00:00:00"}
    (in_tmp / "ws" / LOCK_NAME).write_text(json.dumps(successor))
    lock.release()
    assert json.loads((in_tmp / "ws" / LOCK_NAME).read_text()) == successor
