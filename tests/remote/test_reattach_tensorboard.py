"""A reattached run's events come again from its first step: the local TensorBoard folder gets each step once (no SSH:
the followed lines are handed to `RemoteRun._handle` as `_follow` hands them)."""

from __future__ import annotations

from onetrainer.config import TrainConfig
from onetrainer.remote.providers import LinuxProvider
from onetrainer.remote.run import RemoteRun
from onetrainer.remote.settings import CloudSecrets, CloudSettings
from onetrainer.training.control import TrainingControl
from onetrainer.training.events import Broadcast, Metrics, Started, event_to_json
from onetrainer.training.tensorboard import TensorBoardSink
from tests.helpers import read_scalars


def _follow(tmp_path, steps: range, reattached: bool) -> TensorBoardSink:
    config = TrainConfig()
    config.workspace_dir = str(tmp_path / "workspace")
    config.output_model_destination = str(tmp_path / "out" / "model.safetensors")
    config.tensorboard = False  # the files only, no server
    settings, secrets = CloudSettings(type="LINUX"), CloudSecrets(host="h")
    events = Broadcast([])
    run = RemoteRun(config, settings, secrets, TrainingControl(), events, LinuxProvider(settings, secrets))
    run.reattached = reattached
    lines = [Started("run-1", 10, 1, 10)] + [Metrics(s, loss=float(s), smooth_loss=float(s)) for s in steps]
    for event in lines:
        assert run._handle(event_to_json(event).encode()) is None
    (sink,) = [s for s in events.sinks if isinstance(s, TensorBoardSink)]
    sink.close()
    return sink


def test_a_reattached_run_writes_each_step_once(tmp_path):
    _follow(tmp_path, range(1, 4), reattached=False)  # followed until the app closed at step 3
    sink = _follow(tmp_path, range(1, 7), reattached=True)  # reattached: steps 1-6 replayed
    assert sink.written["loss/train_step"] == 3
    scalars = read_scalars(tmp_path / "workspace" / "tensorboard")
    assert sorted(step for step, _ in scalars["loss/train_step"]) == [1, 2, 3, 4, 5, 6]
    assert len(list((tmp_path / "workspace" / "tensorboard" / "run-1").glob("events.out.tfevents.*"))) == 2


def test_a_new_run_of_the_same_name_writes_every_step(tmp_path):
    _follow(tmp_path, range(1, 4), reattached=False)
    sink = _follow(tmp_path, range(1, 3), reattached=False)  # started anew: nothing of the folder is skipped
    assert sink.written == {}
    scalars = read_scalars(tmp_path / "workspace" / "tensorboard")
    assert sorted(step for step, _ in scalars["loss/train_step"]) == [1, 1, 2, 2, 3]
