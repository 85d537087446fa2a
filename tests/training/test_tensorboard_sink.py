"""The TensorBoard sink writes each record with the time it was queued, not the time of the write that took it."""

from __future__ import annotations

import types

from onetrainer.training import tensorboard
from onetrainer.training.events import Metrics, Scalars


def test_each_record_keeps_the_time_it_was_queued(tmp_path, monkeypatch):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    clock = types.SimpleNamespace(now=1000.0)
    monkeypatch.setattr(tensorboard, "time", types.SimpleNamespace(time=lambda: clock.now))
    monkeypatch.setattr(tensorboard, "WRITE_INTERVAL", 3600.0)  # only the flush below writes
    sink = tensorboard.TensorBoardSink(tmp_path)
    try:
        for step in range(1, 4):
            clock.now = 1000.0 + step / 10  # three steps within one write interval
            sink.emit(Metrics(global_step=step, loss=0.5, smooth_loss=0.5))
        clock.now = 1000.5
        sink.emit(Scalars(global_step=3, values={"validation/loss": 0.25}))
        clock.now = 2000.0  # the write comes later
        sink.flush()
    finally:
        sink.close()
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    assert [(e.step, e.wall_time) for e in events.Scalars("loss/train_step")] == [(1, 1000.1), (2, 1000.2), (3, 1000.3)]
    assert [(e.step, e.wall_time) for e in events.Scalars("validation/loss")] == [(3, 1000.5)]


def _image_file(path, color):
    from PIL import Image

    Image.new("RGB", (8, 8), color).save(path)
    return str(path)


def test_a_sink_that_continues_a_folder_skips_the_steps_it_has_by_tag(tmp_path):
    from onetrainer.training.events import SampleReady
    from tests.helpers import image_tags

    folder = tmp_path / "tensorboard" / "run"
    red, blue = _image_file(tmp_path / "red.png", "red"), _image_file(tmp_path / "blue.png", "blue")
    first = tensorboard.TensorBoardSink(folder)
    for step in (1, 2, 3):
        first.emit(Metrics(global_step=step, loss=float(step), smooth_loss=float(step)))
    first.emit(SampleReady(2, 0, "a cat", red))
    first.close()
    assert tensorboard.written_steps(folder) == {
        "loss/train_step": 3,
        "smooth_loss/train_step": 3,
        "sample/0 - a cat": 2,
    }

    # The run's events again from its first step (a reattached remote run), then the steps it made meanwhile.
    second = tensorboard.TensorBoardSink(folder, written=tensorboard.written_steps(folder))
    for step in (1, 2, 3, 4, 5):
        second.emit(Metrics(global_step=step, loss=10.0 * step, smooth_loss=10.0 * step))
    second.emit(Scalars(global_step=3, values={"validation/loss": 0.5}))  # a tag the folder lacks: written
    second.emit(SampleReady(2, 0, "a cat", blue))
    second.emit(SampleReady(4, 0, "a cat", blue))
    second.close()

    from tests.helpers import read_scalars

    scalars = read_scalars(tmp_path / "tensorboard")
    # Steps 1-3 once, from the first file (its values), 4-5 from the second.
    assert sorted(scalars["loss/train_step"]) == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 40.0), (5, 50.0)]
    assert scalars["validation/loss"] == [(3, 0.5)]
    assert image_tags(tmp_path / "tensorboard") == ["sample/0 - a cat"]
    assert tensorboard.written_steps(folder)["sample/0 - a cat"] == 4
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder), size_guidance={"images": 0})
    events.Reload()
    assert sorted(e.step for e in events.Images("sample/0 - a cat")) == [2, 4]  # the files' order is not the runs'
    assert len(list(folder.glob("events.out.tfevents.*"))) == 2


def test_written_steps_of_a_missing_or_cut_folder(tmp_path):
    assert tensorboard.written_steps(tmp_path / "none") == {}
    sink = tensorboard.TensorBoardSink(tmp_path)
    sink.emit(Metrics(global_step=7, loss=0.5, smooth_loss=0.5))
    sink.close()
    (path,) = tmp_path.glob("events.out.tfevents.*")
    whole = path.read_bytes()
    path.write_bytes(whole + whole[-20:])  # a record cut short at the end (the app ended while it wrote)
    assert tensorboard.written_steps(tmp_path) == {"loss/train_step": 7, "smooth_loss/train_step": 7}
