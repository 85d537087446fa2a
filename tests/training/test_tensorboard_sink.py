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
