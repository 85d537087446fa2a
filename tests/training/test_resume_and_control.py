"""Backups, resume, stop and failure: the run's life cycle and the events it emits."""

from __future__ import annotations

import json
import socket
import urllib.request
from pathlib import Path

import pytest

from onetrainer.config import config_from_dict
from onetrainer.training.checkpoint import list_backups, read_progress
from onetrainer.training.control import TrainingControl
from onetrainer.training.events import Failed, Finished, ListSink, Metrics, Progress, SampleReady, Started, Status
from onetrainer.training.runner import run_training
from onetrainer.training.tensorboard import TensorBoardServer, find_free_port
from tests.helpers import image_folder, tiny_config


def run(config_dict: dict, control: TrainingControl | None = None, sink: ListSink | None = None):
    config, problems = config_from_dict(config_dict)
    assert [p for p in problems if p.is_error] == []
    sink = sink or ListSink()
    outcome = run_training(config, control or TrainingControl(), [sink])
    return outcome, sink


def losses(sink: ListSink) -> dict[int, float]:
    return {m.global_step: m.loss for m in sink.of(Metrics)}


class StopAfter(ListSink):
    """Requests a stop once `steps` steps are done."""

    def __init__(self, control: TrainingControl, steps: int) -> None:
        super().__init__()
        self.control, self.steps = control, steps

    def emit(self, event) -> None:
        super().emit(event)
        if isinstance(event, Progress) and event.global_step >= self.steps:
            self.control.request_stop()


@pytest.mark.parametrize("method", ["LORA", "FINE_TUNE"])
def test_resumed_run_reproduces_the_uninterrupted_run(tmp_path, method):
    image_folder(tmp_path, count=6)
    common = {"method": method, "epochs": 2, "backup_before_save": True, "dropout_probability": 0.1}
    if method == "FINE_TUNE":
        common.update(learning_rate=1e-4, output_model_format="DIFFUSERS", output_model_destination=str(tmp_path / "m"))
    straight, sink = run(
        tiny_config(tmp_path / "a", **common, concepts=[{"path": str(tmp_path / "images"), "seed": 7}])
    )
    assert isinstance(straight, Finished) and straight.reason == "completed"
    expected = losses(sink)
    assert len(expected) == 6  # 2 epochs x 3 steps (6 images, batch 2)

    b = tiny_config(tmp_path / "b", **common, concepts=[{"path": str(tmp_path / "images"), "seed": 7}])
    control = TrainingControl()
    stopped, first = run(b, control, StopAfter(control, 3))  # stop after epoch 1
    assert isinstance(stopped, Finished) and stopped.reason == "stopped"
    backups = list_backups(tmp_path / "b" / "workspace" / "backup")
    assert len(backups) == 1 and read_progress(backups[0]).epoch == 1

    resumed, second = run({**b, "continue_last_backup": True})
    assert isinstance(resumed, Finished) and resumed.reason == "completed"
    assert any("resumed from" in s.text for s in second.of(Status))
    got = {**losses(first), **losses(second)}
    assert sorted(got) == sorted(expected)
    for step, value in expected.items():
        assert got[step] == pytest.approx(value, rel=1e-4, abs=1e-6), step

    again, third = run({**b, "continue_last_backup": True})
    assert isinstance(again, Finished) and again.reason == "nothing to do"
    assert any("already trained" in s.text for s in third.of(Status))


def test_events_of_a_normal_run(tmp_path):
    image_folder(tmp_path)
    config = tiny_config(
        tmp_path, epochs=1, sample_after=1, sample_after_unit="STEP",
        samples=[{"prompt": "a circle", "width": 64, "height": 64, "diffusion_steps": 2}],
    )  # fmt: skip
    outcome, sink = run(config)
    assert isinstance(outcome, Finished)
    [started] = sink.of(Started)
    assert (started.total_steps, started.steps_per_epoch, started.total_epochs) == (2, 2, 1)
    progress = sink.of(Progress)
    assert [p.global_step for p in progress] == [1, 2]
    assert progress[-1].steps_per_second > 0 and progress[-1].eta_seconds == 0
    assert len(sink.of(SampleReady)) == 2
    assert isinstance(sink.events[-1], Finished)
    log = (tmp_path / "workspace" / "logs").glob("*.log")
    text = next(log).read_text()
    assert "step 2: loss=" in text and "Finished (completed)" in text
    saved = json.loads(next((tmp_path / "workspace" / "config").glob("*.json")).read_text())
    assert saved["concepts"][0]["path"] == str(tmp_path / "images")  # the packed config of the run
    assert saved["base_model_name"] == "tiny:sd15"  # as given, not the cache folder the name stands for


def test_commands_from_another_thread(tmp_path):
    image_folder(tmp_path, count=8)
    control = TrainingControl()

    class Commands(ListSink):
        def emit(self, event) -> None:
            super().emit(event)
            if isinstance(event, Progress) and event.global_step == 1:
                control.request_backup()
                control.request_save()
                control.request_sample()

    config = tiny_config(tmp_path, epochs=1, samples=[{"prompt": "x", "width": 64, "height": 64, "diffusion_steps": 2}])
    outcome, sink = run(config, control, Commands())
    assert isinstance(outcome, Finished)
    assert len(list_backups(tmp_path / "workspace" / "backup")) == 1
    assert len(list((tmp_path / "workspace" / "save").glob("*.safetensors"))) == 1
    assert [e.global_step for e in sink.of(SampleReady)] == [1]


def test_stop_saves_the_model(tmp_path):
    image_folder(tmp_path, count=8)
    control = TrainingControl()
    outcome, _ = run(tiny_config(tmp_path, epochs=5), control, StopAfter(control, 2))
    assert isinstance(outcome, Finished) and outcome.reason == "stopped" and outcome.global_step == 2
    assert (tmp_path / "out" / "lora.safetensors").is_file()


def test_failure_is_an_event_with_a_message_and_the_log(tmp_path):
    image_folder(tmp_path)
    broken = tmp_path / "broken.safetensors"
    broken.write_bytes(b"not a safetensors file")
    outcome, sink = run(tiny_config(tmp_path, lora_model_name=str(broken)))
    assert isinstance(outcome, Failed) and sink.events[-1] is outcome
    assert "Traceback" in outcome.traceback
    log = Path(outcome.log_path).read_text()
    assert "Training failed: " in log and "Traceback" in log


def test_invalid_config_fails_before_training(tmp_path):
    outcome, _ = run(tiny_config(tmp_path))  # no image folder
    assert isinstance(outcome, Failed) and "folder not found" in outcome.message


def test_existing_output_is_replaced_unless_overwrites_are_prevented(tmp_path):
    image_folder(tmp_path)
    target = tmp_path / "out" / "lora.safetensors"
    target.parent.mkdir()
    target.write_bytes(b"old")
    outcome, _ = run(tiny_config(tmp_path, epochs=1, prevent_overwrites=True))
    assert isinstance(outcome, Failed) and "already exists" in outcome.message and target.read_bytes() == b"old"
    outcome, _ = run(tiny_config(tmp_path, epochs=1))
    assert isinstance(outcome, Finished) and target.read_bytes() != b"old"
    assert [p.name for p in target.parent.iterdir()] == ["lora.safetensors"]  # no temporary files left


def test_rolling_backups_keep_the_newest(tmp_path):
    image_folder(tmp_path, count=8)
    config = tiny_config(tmp_path, epochs=1, backup_after=1, backup_after_unit="STEP", rolling_backup=True)
    config["rolling_backup_count"] = 2
    outcome, _ = run(config)
    backups = list_backups(tmp_path / "workspace" / "backup")
    assert isinstance(outcome, Finished) and [read_progress(b).global_step for b in backups] == [3, 4]


def test_tensorboard_server_serves_and_moves_past_a_port_another_program_holds(tmp_path):
    port = find_free_port(16006)
    server = TensorBoardServer(tmp_path, port)
    try:
        assert server.start(wait_seconds=60) == f"TensorBoard: http://localhost:{port}/"
        assert server.wait_until_serving(60)
        with urllib.request.urlopen(server.url, timeout=10) as response:
            assert response.status == 200
    finally:
        server.stop()
    assert not server.running
    # Another program (another run's process) holds a port: one the system hands out, not the port just served, which
    # the stopped server's closed connections may still hold for a while (TIME_WAIT) or another process may take.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        held = taken.getsockname()[1]
        moved = TensorBoardServer(tmp_path, held)
        try:
            message = moved.start()
            assert moved.port != held and f"port {held} was busy" in message
        finally:
            moved.stop()


def test_one_tensorboard_per_port_in_a_process(tmp_path):
    """A server asked for the port of one this process runs takes that one over (the same folder: the app's
    TensorBoard button's server when a run starts on its workspace) or stops it first (another folder: a kept server
    when the next run starts elsewhere): one TensorBoard at the port the user set, none left on the next port."""
    port = find_free_port(17006)
    button = TensorBoardServer(tmp_path / "a", port)
    run = TensorBoardServer(tmp_path / "a" / ".." / "a", port)
    elsewhere = TensorBoardServer(tmp_path / "b", port)
    try:
        button.start()
        child = button.process
        assert run.start() == f"TensorBoard: http://localhost:{port}/ (already running)"
        assert run.process is child and run.port == port and not button.running
        button.stop()  # owns nothing now: the run's server goes on
        assert run.running
        elsewhere.start()
        assert elsewhere.port == port and elsewhere.process is not child and elsewhere.running
        assert child.poll() is not None and not run.running
    finally:
        for server in (button, run, elsewhere):
            server.stop()
