"""The queue of runs in the app: Add to queue beside Start, the queue window (status per entry, Up / Down, Remove, Run
queue) and the footer's count; two tiny runs queued from the window train one after another with the real trainer."""

from __future__ import annotations

from pathlib import Path

import pytest

from onetrainer.config import config_from_dict
from onetrainer.training.job_queue import FAILED, FINISHED, QUEUED, JobQueue
from tests.gui.helpers import pump
from tests.helpers import image_folder, tiny_config

pytestmark = [pytest.mark.gui, pytest.mark.slow]
RUN_TIMEOUT = 600  # seconds: two tiny runs take well under a minute on two idle cores


def tiny(root: Path):
    image_folder(root, count=2)
    config, problems = config_from_dict(tiny_config(root, epochs=1))
    assert [p for p in problems if p.is_error] == []
    return config


@pytest.fixture
def queue_app(app, state_dir: Path, trainable_sd):
    app.runner.train_function = None  # the real trainer
    # This test's queue file (`state_dir`): the footer reads it now, not at its next 5 s look, which the shared window
    # might otherwise take after an earlier test's queue
    app.queue_changed()
    yield app
    if app.queue_running:
        app.stop_queue()
        pump(app, lambda: not app.queue_running, RUN_TIMEOUT)
    if app.queue_window is not None and app.queue_window.winfo_exists():
        app.queue_window.destroy()


def test_two_queued_configs_train_one_after_another(queue_app, tmp_path: Path, state_dir: Path, screenshot) -> None:
    app = queue_app
    assert app.footer.queue_text == "Queue: empty"
    for name in ("a", "b"):
        app.model.replace(tiny(tmp_path / name))
        app.footer.queue_add_button.invoke()
        assert app.footer.status.startswith("Added to the queue: lora.safetensors"), app.footer.status
    assert app.footer.queue_text == "Queue: 2 waiting"
    app.model.config.epochs = 5  # edits after queueing change nothing queued
    queue = JobQueue(state_dir / "job-queue.json")  # the app's folder
    first, second = queue.entries()
    assert (first.config["epochs"], second.config["epochs"]) == (1, 1)
    assert first.config["workspace_dir"] == str(tmp_path / "a" / "workspace")

    window = app.open_queue()
    assert window.status_of(1) == f"{QUEUED}: writes {tmp_path / 'a' / 'out' / 'lora.safetensors'}"
    window.selected.set(second.id)
    window.up_button.invoke()
    assert [e.id for e in queue.entries()] == [second.id, first.id]
    window.down_button.invoke()
    assert [e.id for e in queue.entries()] == [first.id, second.id]

    window.run_button.invoke()
    assert app.queue_running and window.run_button.cget("text") == "Stop queue"
    assert app.footer.queue_text == "Queue: running, 1 waiting"
    with pytest.raises(Exception, match="is running"):
        queue.remove(1)  # the window's Remove says the same on its message line
    window.selected.set(first.id)
    window.remove_button.invoke()
    assert "is running: stop it first" in window.message.cget("text")
    pump(app, lambda: not app.queue_running, RUN_TIMEOUT)

    assert [e.status for e in queue.entries()] == [FINISHED, FINISHED]
    assert window.status_of(1).startswith("finished: completed") and window.status_of(2).startswith("finished")
    assert app.footer.status == "Queue: 2 run(s), 0 failed; 0 waiting", app.footer.status
    assert app.footer.queue_text == "Queue: 0 waiting" and window.run_button.cget("text") == "Run queue"
    for name in ("a", "b"):
        assert (tmp_path / name / "out" / "lora.safetensors").is_file()
    assert not (state_dir / "job-queue.lock").exists()
    screenshot(window, "queue-window")
    log = app.log.text
    assert log.index(f"Queue: {first.name} ({first.id}) starts") < log.index(f"({second.id}) starts")

    window.clear_button.invoke()
    assert queue.entries() == [] and app.footer.queue_text == "Queue: empty"


def test_a_refused_config_is_not_queued_and_a_failed_run_shows_its_reason(
    queue_app, tmp_path: Path, state_dir: Path
) -> None:
    app = queue_app
    config = tiny(tmp_path / "a")
    config.concepts[0].path = str(tmp_path / "nowhere")
    app.model.replace(config)
    assert app.add_to_queue() is None
    assert app.footer.status.startswith("Cannot queue, 1 problem"), app.footer.status
    app.dialogs.close_windows()
    queue = JobQueue(state_dir / "job-queue.json")
    assert queue.entries() == []

    app.model.replace(tiny(tmp_path / "b"))
    entry = app.add_to_queue()
    (tmp_path / "b" / "images").rename(tmp_path / "b" / "moved")  # gone by the time the queue runs
    assert app.run_queue()
    pump(app, lambda: not app.queue_running, RUN_TIMEOUT)
    (recorded,) = queue.entries()
    assert recorded.id == entry.id and recorded.status == FAILED and str(tmp_path / "b" / "images") in recorded.reason
    assert app.footer.status.startswith("Queue: 1 run(s), 1 failed; 0 waiting. Failed: "), app.footer.status
    assert app.footer.status_level == "error"
    assert not [w for w in app.dialogs.windows if w.winfo_exists()]  # no dialog waits for a queue's failure


def test_stop_ends_the_queue_with_the_rest_queued_and_one_runner_at_a_time(
    queue_app, tmp_path: Path, state_dir: Path
) -> None:
    from onetrainer.training.job_queue import STOPPED, QueueRunnerLock
    from tests.gui.conftest import FakeTrainer

    app = queue_app
    app.runner.train_function = FakeTrainer(hold=True)  # holds after its first step until stopped
    for name in ("a", "b"):
        app.model.replace(tiny(tmp_path / name))
        assert app.add_to_queue() is not None
    queue = JobQueue(state_dir / "job-queue.json")
    held = QueueRunnerLock.acquire(queue)  # as a terminal's job_queue.py run would
    try:
        window = app.open_queue()
        window.run_button.invoke()
        assert not app.queue_running
        assert "is being run by process" in window.message.cget("text") and app.footer.status_level == "error"
    finally:
        held.release()
    assert app.run_queue()
    pump(app, lambda: app.footer.commands_enabled)  # the first run's steps go
    assert app.start() is False  # Start is Stop while a run of the queue goes
    pump(app, lambda: not app.queue_running)
    assert [e.status for e in queue.entries()] == [STOPPED, QUEUED]
    assert app.footer.status == "Queue: 1 run(s), 0 failed; 1 waiting (stopped: Run queue goes on with them)"
    assert app.footer.queue_text == "Queue: 1 waiting"
