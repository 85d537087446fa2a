"""The app's Start with `multi_gpu`: this process trains as rank 0 and starts rank 1 as a child (two CPU processes,
gloo). Rank 0's events reach the caller's sinks; the window's commands reach both ranks through the per-step sync."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from onetrainer.config import config_from_dict
from onetrainer.tiny import tiny_model_dir
from onetrainer.training import launcher, rank_worker
from onetrainer.training.control import TrainingControl
from onetrainer.training.events import Failed, Finished, Metrics, SampleReady, Started
from onetrainer.training.runner import run_training
from tests.helpers import image_folder, tiny_config

SAMPLE = {"prompt": "a red circle", "width": 64, "height": 64, "diffusion_steps": 2}


def _recorded_children(monkeypatch) -> list:
    """The rank processes the launcher starts, as it starts them."""
    children = []

    class Recorded(launcher.RankProcess):
        def __init__(self, *args) -> None:
            super().__init__(*args)
            children.append(self)

    monkeypatch.setattr(launcher, "RankProcess", Recorded)
    return children


class _Window:
    """What the app does while a run goes: collects the events, presses buttons after given steps."""

    def __init__(self, control: TrainingControl, presses: dict[int, list[str]]) -> None:
        self.control, self.presses, self.events = control, presses, []

    def emit(self, event) -> None:
        self.events.append(event)
        if isinstance(event, Metrics):
            for command in self.presses.get(event.global_step, []):
                getattr(self.control, f"request_{command}")()

    def close(self) -> None:
        pass


def _config(root: Path, **overrides):
    image_folder(root, count=4)
    settings = tiny_config(root, batch_size=1, epochs=3, multi_gpu=True, device_indexes="0,1", **overrides)
    config, problems = config_from_dict(settings)
    assert not [p for p in problems if p.is_error], problems
    return config


@pytest.mark.slow
def test_two_cpu_ranks_train_from_the_app_and_every_command_reaches_both(tmp_path):
    tiny_model_dir("sd15")  # built here once; the child only reads it
    config = _config(tmp_path, samples=[SAMPLE])
    control = TrainingControl()
    # After step 1 sample / save / backup now (done after step 2 on rank 0, once); after step 2 Stop (after step 3).
    window = _Window(control, {1: ["sample", "save", "backup"], 2: ["stop"]})
    outcome = run_training(config, control, [window])
    assert isinstance(outcome, Finished), outcome
    assert (outcome.reason, outcome.global_step) == ("stopped", 3)

    started = [e for e in window.events if isinstance(e, Started)]
    assert len(started) == 1 and started[0].total_steps == 6  # 4 images × 3 epochs at the global batch of 2
    assert [e.global_step for e in window.events if isinstance(e, Metrics)] == [1, 2, 3]
    assert len([e for e in window.events if isinstance(e, SampleReady)]) == 1

    workspace = tmp_path / "workspace"
    written = [p for folder in ("samples", "backup", "save") for p in (workspace / folder).rglob("*-2-0-2*")]
    # Each once, after step 2 (the step whose sync carried them), by rank 0 alone.
    assert sorted(p.relative_to(workspace).parts[0] for p in written) == ["backup", "samples", "save"], written
    assert len(list((workspace / "samples").rglob("*.*"))) == 1 and len(list((workspace / "backup").iterdir())) == 1
    assert len(list((workspace / "tensorboard").iterdir())) == 1
    assert (tmp_path / "out" / "lora.safetensors").is_file()
    # Rank 1 trained the same steps and stopped with rank 0: its own log, three steps, the same end.
    (rank1,) = (workspace / "logs").glob("*-rank1.log")
    log = rank1.read_text()
    assert "step 3:" in log and "step 4:" not in log and "stopped" in log, log


@pytest.mark.slow
def test_a_child_rank_that_cannot_start_ends_the_run_at_once_with_its_words(tmp_path, monkeypatch):
    # A broken environment in the child only (sitecustomize runs at its start, not in this process).
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import os, sys\nif os.environ.get('RANK') == '1':\n"
        "    print('CUDA driver too old (test)', file=sys.stderr, flush=True)\n    os._exit(5)\n"
    )
    monkeypatch.setenv("PYTHONPATH", str(site))
    # Not the group's start timeout: that ends with its own message (here after 10 minutes, not 30, should it come).
    monkeypatch.setenv("ONETRAINER_DIST_TIMEOUT", "600")
    outcome = run_training(_config(tmp_path), TrainingControl(), [])
    assert isinstance(outcome, Failed)
    assert outcome.message == "rank 1 of 2 failed: the process ended (exit code 5); its last output: CUDA driver " \
        "too old (test)", outcome.message  # fmt: skip


@pytest.mark.slow
def test_a_child_rank_killed_mid_run_ends_the_run_with_its_end(tmp_path, monkeypatch):
    tiny_model_dir("sd15")
    children = _recorded_children(monkeypatch)
    control = TrainingControl()
    window = _Window(control, {})
    window.emit = lambda event, emit=window.emit: (
        emit(event),
        isinstance(event, Metrics) and event.global_step == 1 and children[0].process.kill(),
    )
    outcome = run_training(_config(tmp_path), control, [window])
    assert isinstance(outcome, Failed)
    assert outcome.message == "rank 1 of 2 failed: the process ended (killed by SIGKILL)", outcome.message
    assert not (tmp_path / "out" / "lora.safetensors").exists()


@pytest.mark.slow
def test_a_child_rank_ends_when_the_process_that_started_it_is_gone(tmp_path):
    """Waiting to join a rank 0 that never comes (the app was killed): its standard input closes and it ends."""
    config_path = tmp_path / "config.json"
    config_path.write_text(json.dumps(_config(tmp_path).to_dict()), encoding="utf-8")
    ready = tmp_path / "rank1.ready"
    env = {
        **os.environ,
        "RANK": "1",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(launcher.free_port()),
        "PYTHONPATH": str(launcher.PACKAGE_ROOT),
    }
    command = [sys.executable, "-m", "onetrainer.training.rank_worker", "--config-path", str(config_path)]
    child = subprocess.Popen([*command, "--ready-path", str(ready)], stdin=subprocess.PIPE, env=env)
    try:
        deadline = time.monotonic() + 120
        while not ready.exists() and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert ready.exists() and child.poll() is None  # now waiting for rank 0
        child.stdin.close()  # what the parent's end does, however it ends
        assert child.wait(timeout=20) == rank_worker.PARENT_GONE
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


@pytest.mark.slow
def test_a_child_rank_that_never_gets_ready_ends_the_run_after_the_timeout(tmp_path, monkeypatch):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import os, time\nif os.environ.get('RANK') == '1':\n    time.sleep(60)\n")
    monkeypatch.setenv("PYTHONPATH", str(site))
    monkeypatch.setenv("ONETRAINER_DIST_TIMEOUT", "2")
    children = _recorded_children(monkeypatch)
    outcome = run_training(_config(tmp_path), TrainingControl(), [])
    assert isinstance(outcome, Failed)
    assert outcome.message == "the other training processes did not start within 2 s (ONETRAINER_DIST_TIMEOUT)"
    [child] = children  # ended (by a signal) while it slept, not waited for
    assert child.process.returncode is not None and child.process.returncode < 0, child.process.returncode
