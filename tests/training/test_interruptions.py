"""Nothing lost on a bad day (in-process drills): failed saves, stops before training, full disks, shared
workspaces, damaged caches and backups. The subprocess drills (signals) are in tests/cli/test_train_drills.py."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest
from safetensors import safe_open

from onetrainer.config import config_from_dict
from onetrainer.data.cache import _looks_complete
from onetrainer.training import outputs as outputs_module
from onetrainer.training import preparation as preparation_module
from onetrainer.training import trainer as trainer_module
from onetrainer.training.checkpoint import list_backups, read_progress
from onetrainer.training.control import TrainingControl
from onetrainer.training.events import (
    Broadcast,
    CacheFilled,
    CacheProgress,
    Failed,
    Finished,
    ListSink,
    Metrics,
    Progress,
    Started,
    Status,
    Warning_,
)
from onetrainer.training.runner import run_training
from onetrainer.training.tensorboard import RunTensorBoard
from onetrainer.util.disk import write_error_message
from tests.helpers import image_folder, tiny_config


def run(config_dict: dict, control: TrainingControl | None = None, sink: ListSink | None = None, checked=False):
    config, problems = config_from_dict(config_dict)
    assert [p for p in problems if p.is_error] == []
    sink = sink or ListSink()
    return run_training(config, control or TrainingControl(), [sink], checked=checked), sink


def texts(sink: ListSink, kind=Status) -> str:
    return "\n".join(e.text for e in sink.of(kind))


class StopOn(ListSink):
    """Requests a stop when a status line contains `text`."""

    def __init__(self, control: TrainingControl, text: str) -> None:
        super().__init__()
        self.control, self.text = control, text

    def emit(self, event) -> None:
        super().emit(event)
        if isinstance(event, Status) and self.text in event.text:
            self.control.request_stop()


def test_a_failed_final_save_keeps_a_backup_and_resume_saves_the_model(tmp_path):
    image_folder(tmp_path)
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the output folder should be")
    config = tiny_config(tmp_path, epochs=1, output_model_destination=str(blocker / "lora.safetensors"))
    failed, _ = run(config, checked=True)  # the start checks would refuse this path (tested in the CLI tests)
    assert isinstance(failed, Failed)
    assert "could not be saved" in failed.message and str(blocker) in failed.message
    assert "Continue from last backup" in failed.message
    [kept] = list_backups(tmp_path / "workspace" / "backup")  # written because the save failed
    assert str(kept) in failed.message and read_progress(kept).global_step == 2

    # Fixed output path, resumed: every epoch is trained, but the model was never written — resume writes it.
    output = tmp_path / "out" / "lora.safetensors"
    fixed = {**config, "output_model_destination": str(output), "continue_last_backup": True}
    outcome, sink = run(fixed)
    assert isinstance(outcome, Finished) and outcome.reason == "completed" and outcome.output_path == str(output)
    assert output.is_file() and "saving" in texts(sink)
    assert "output_model_destination" in texts(sink, Warning_)  # the changed setting is reported
    # Once saved, a further resume has nothing to do.
    again, sink = run(fixed)
    assert isinstance(again, Finished) and again.reason == "nothing to do"


@pytest.mark.parametrize("moment", ["loading the model", "reading the training images"])
def test_a_stop_before_the_first_step_writes_nothing(tmp_path, moment):
    image_folder(tmp_path)
    output = tmp_path / "out" / "lora.safetensors"
    output.parent.mkdir()
    output.write_bytes(b"a trained LoRA")
    leftover = output.with_name(".lora.safetensors.pid999999999-0badf00d.tmp")  # from a write a kill cut short
    leftover.write_bytes(b"half")
    control = TrainingControl()
    sink = StopOn(control, moment)
    outcome, _ = run(tiny_config(tmp_path, backup_before_save=True), control, sink)
    assert isinstance(outcome, Finished) and outcome.reason == "stopped" and outcome.output_path == ""
    assert output.read_bytes() == b"a trained LoRA"  # not replaced by an untrained (all-zero) LoRA
    assert not sink.of(Started) and not sink.of(Failed)
    assert "no model is written" in texts(sink) and str(output) in texts(sink)
    assert list_backups(tmp_path / "workspace" / "backup") == []
    assert not leftover.exists() and f"removed {leftover}" in texts(sink)


class StopAtEntry(ListSink):
    """Requests a stop when the cache pass of `kind` reports its `entry`-th entry written."""

    def __init__(self, control: TrainingControl, kind: str, entry: int) -> None:
        super().__init__()
        self.control, self.kind, self.entry = control, kind, entry

    def emit(self, event) -> None:
        super().emit(event)
        if isinstance(event, CacheProgress) and (event.kind, event.done) == (self.kind, self.entry):
            self.control.request_stop()


def _entries(cache: Path, kind: str) -> list[Path]:
    return sorted((cache / kind).rglob("*.safetensors"))


def test_a_stop_during_caching_ends_it_after_the_current_entry_and_keeps_what_is_cached(tmp_path):
    image_folder(tmp_path)  # 4 images of one bucket: one encoding batch, written entry by entry
    config = tiny_config(tmp_path, backup_before_save=True)
    control = TrainingControl()
    sink = StopAtEntry(control, "latents", 1)
    outcome, _ = run(config, control, sink)
    assert isinstance(outcome, Finished) and outcome.reason == "stopped during caching" and outcome.output_path == ""
    # The entry written when the stop came is kept, and nothing after it: not the rest of its batch, nor captions.
    assert len(_entries(tmp_path / "cache", "latents")) == 1 and not _entries(tmp_path / "cache", "text")
    progress = sink.of(CacheProgress)
    assert [(e.kind, e.done, e.total) for e in progress] == [("latents", 0, 4), ("latents", 1, 4)]
    assert progress[0].eta_seconds is None and progress[1].eta_seconds is not None
    assert "stopped during caching: 1 of 4 images were encoded (latents) and stay in the cache" in texts(sink)
    assert "no model is written" in texts(sink) and not sink.of(Started) and not sink.of(CacheFilled)
    assert not (tmp_path / "out").exists()
    # The next run encodes only what is missing, and reports each entry of both passes.
    cached, sink = run({**config, "only_cache": True})
    assert isinstance(cached, Finished) and cached.reason == "cached"
    latents = [e for e in sink.of(CacheProgress) if e.kind == "latents"]
    assert [(e.done, e.total) for e in latents] == [(0, 3), (1, 3), (2, 3), (3, 3)]
    assert sink.of(CacheFilled)[0].encoded == 3 and len(_entries(tmp_path / "cache", "latents")) == 4


def test_a_stop_inside_an_encoders_forward_pass_ends_it_at_the_next_layer(tmp_path, monkeypatch):
    """A batch of a large encoder can take minutes: a stop requested while it runs ends it before its next layer, and
    nothing of that batch is written."""
    image_folder(tmp_path)  # 4 images of one bucket: one encoding batch
    control = TrainingControl()
    finished: list[str] = []
    fill = preparation_module.fill_latent_cache

    def stop_in_the_first_layer(data, family, model, *args, **kwargs):
        def after_forward(module, _args, _output) -> None:
            finished.append(type(module).__name__)
            control.request_stop()  # as the Stop button does, from within the VAE's first layer

        handles = [m.register_forward_hook(after_forward) for part in model.parts.values() for m in part.modules()]
        try:
            return fill(data, family, model, *args, **kwargs)
        finally:
            for handle in handles:
                handle.remove()

    monkeypatch.setattr(preparation_module, "fill_latent_cache", stop_in_the_first_layer)
    outcome, sink = run(tiny_config(tmp_path), control)
    assert isinstance(outcome, Finished) and outcome.reason == "stopped during caching"
    assert len(finished) == 1  # the layer that saw the stop; no other layer of the batch ran after it
    assert not _entries(tmp_path / "cache", "latents") and not _entries(tmp_path / "cache", "text")
    assert "stopped during caching: 0 of 4 images were encoded" in texts(sink) and not sink.of(Started)


def test_a_failed_periodic_backup_warns_and_training_goes_on(tmp_path, monkeypatch):
    image_folder(tmp_path)
    real = outputs_module.write_backup
    calls = []

    def full_disk_once(root, *args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise OSError(errno.ENOSPC, "No space left on device", str(root / "2026-backup-1-0-1"))
        return real(root, *args, **kwargs)

    monkeypatch.setattr(outputs_module, "write_backup", full_disk_once)
    config = tiny_config(tmp_path, epochs=1, backup_after=1, backup_after_unit="STEP", include_train_config="SETTINGS")
    outcome, sink = run(config)
    assert isinstance(outcome, Finished) and outcome.reason == "completed"
    warning = texts(sink, Warning_)
    assert "backup at step 1 failed: disk full" in warning and "2026-backup-1-0-1" in warning
    assert [read_progress(b).global_step for b in list_backups(tmp_path / "workspace" / "backup")] == [2]
    with safe_open(outcome.output_path, "pt") as f:
        stored = json.loads(f.metadata()["ot_config"])  # include_train_config: SETTINGS, as OneTrainer writes it
    assert stored["learning_rate"] == 1e-3 and "concepts" not in stored and "samples" not in stored


def test_disk_full_is_said_in_words_with_the_path(tmp_path):
    torch_error = RuntimeError("[enforce fail at inline_container.cc:626] . unexpected pos 64 vs 0")
    assert write_error_message(torch_error, tmp_path / "x.pt").startswith(f"disk full: cannot write {tmp_path}")
    os_error = OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "y"))
    assert write_error_message(os_error).startswith(f"disk full: cannot write {tmp_path / 'y'}")
    rust_error = Exception('Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space" })')
    assert write_error_message(rust_error, tmp_path / "z").startswith(f"disk full: cannot write {tmp_path / 'z'}")


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_a_full_workspace_at_start_is_a_message(tmp_path, monkeypatch):
    from onetrainer.training.workspace import Workspace

    image_folder(tmp_path)
    monkeypatch.setattr(Workspace, "log_path", property(lambda self: Path("/dev/full")))  # every write: ENOSPC
    outcome, _ = run(tiny_config(tmp_path))
    assert isinstance(outcome, Failed) and "disk full: cannot write /dev/full" in outcome.message


def test_damaged_cache_entries_are_encoded_again_and_clearing_works(tmp_path):
    image_folder(tmp_path)
    config = tiny_config(tmp_path, epochs=1, text_encoder={"train": False})  # frozen: its outputs are cached
    first, sink = run(config)
    assert isinstance(first, Finished)
    entries = sorted((tmp_path / "cache").rglob("*.safetensors"))
    text_entries = [p for p in entries if "text" in p.parts]
    latents = [p for p in entries if "latents" in p.parts]
    assert text_entries and latents
    for damaged in [*text_entries, latents[0]]:  # cut short, as a full disk or a killed copy leaves them
        damaged.write_bytes(damaged.read_bytes()[:100])

    second, sink = run(config)
    assert isinstance(second, Finished) and second.reason == "completed"
    filled = {e.kind: e for e in sink.of(CacheFilled)}
    assert filled["latents"].encoded == 1 and filled["captions"].encoded == len(text_entries)
    assert all(_looks_complete(p) for p in [*text_entries, latents[0]])  # repaired on disk

    third, sink = run({**config, "clear_cache_before_training": True})
    assert isinstance(third, Finished) and "cleared the cache" in texts(sink)
    filled = {e.kind: e for e in sink.of(CacheFilled)}
    assert filled["latents"].encoded == filled["latents"].needed > 0


def test_prevent_overwrites_is_checked_again_at_save_time(tmp_path):
    image_folder(tmp_path)
    output = tmp_path / "out" / "lora.safetensors"

    class OtherRunSaves(ListSink):
        def emit(self, event) -> None:
            super().emit(event)
            if isinstance(event, Progress) and event.global_step == 1:
                output.parent.mkdir(exist_ok=True)
                output.write_bytes(b"the other run's model")

    config = tiny_config(tmp_path, epochs=1, prevent_overwrites=True, include_train_config="ALL")
    outcome, sink = run(config, sink=OtherRunSaves())
    assert isinstance(outcome, Finished) and output.read_bytes() == b"the other run's model"
    saved = Path(outcome.output_path)
    assert saved != output and saved.parent == output.parent and saved.is_file()
    assert "Prevent overwrites" in texts(sink, Warning_) and str(saved) in texts(sink, Warning_)
    with safe_open(str(saved), "pt") as f:
        stored = json.loads(f.metadata()["ot_config"])  # include_train_config: ALL has the concepts inline
    assert stored["concepts"][0]["path"] == str(tmp_path / "images")


def test_resume_skips_a_damaged_backup_and_reports_changed_settings(tmp_path):
    image_folder(tmp_path)
    config = tiny_config(tmp_path, epochs=1, backup_after=1, backup_after_unit="STEP")
    first, _ = run(config)
    assert isinstance(first, Finished)
    older, newest = list_backups(tmp_path / "workspace" / "backup")
    (newest / "lora" / "unet.safetensors").unlink()

    resumed, sink = run({**config, "epochs": 2, "learning_rate": 5e-4, "continue_last_backup": True})
    assert isinstance(resumed, Finished) and resumed.reason == "completed"
    warnings = texts(sink, Warning_)
    assert f"backup {newest.name} is damaged and skipped" in warnings and "unet.safetensors is missing" in warnings
    assert f"resumed from {older.name}" in texts(sink)
    assert "learning_rate: 0.001 in the backup, 0.0005 now" in warnings and "config's values are used" in warnings
    rates = {m.global_step: next(iter(m.learning_rates.values())) for m in sink.of(Metrics)}
    assert min(rates) == 2 and rates[2] == pytest.approx(5e-4)  # the configured rate, not the backup's


def test_a_tensorboard_server_that_lost_its_port_is_started_again_then_reported(tmp_path):
    class DeadServer:
        port = 6006

        def failure(self) -> str:
            return "TensorBoard on port 6006 stopped (exit code 1): it was already in use"

    sink = ListSink()
    tensorboard = RunTensorBoard(config_from_dict(tiny_config(tmp_path))[0], None, Broadcast([sink]), writes=True)
    launched: list[int] = []

    def launch(port: int) -> None:
        launched.append(port)
        tensorboard.server = DeadServer()

    tensorboard._launch = launch
    tensorboard.server = DeadServer()
    tensorboard.check()
    assert launched == [6007] and "starting it on another port" in texts(sink, Warning_)
    tensorboard.check()  # the second failure is reported, not retried forever
    assert launched == [6007] and "not available for this run" in texts(sink, Warning_)
    assert "already in use" in texts(sink, Warning_)
    tensorboard.check()
    assert launched == [6007]


def test_a_second_interrupt_wrapped_by_a_library_is_an_abort_not_a_failure(tmp_path, monkeypatch):
    """diffusers' lazy imports turn a KeyboardInterrupt into a RuntimeError: after a second Ctrl+C it still reads as
    the user's abort (exit 130, one line), not as 'Training failed' with a traceback."""
    from onetrainer.training.runner import ABORTED

    image_folder(tmp_path)
    control = TrainingControl()

    def interrupted_in_an_import(self):
        control.request_abort()  # what the CLI's signal handler does before raising KeyboardInterrupt
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as e:
            raise RuntimeError("Failed to import diffusers.pipelines.onnx_utils: initialization failed") from e

    monkeypatch.setattr(trainer_module.Trainer, "run", interrupted_in_an_import)
    outcome, _ = run(tiny_config(tmp_path), control, checked=True)
    assert isinstance(outcome, Failed) and outcome.message == ABORTED and outcome.traceback == ""

    monkeypatch.setattr(trainer_module.Trainer, "run", lambda self: (_ for _ in ()).throw(RuntimeError("real")))
    outcome, _ = run(tiny_config(tmp_path), TrainingControl(), checked=True)
    assert isinstance(outcome, Failed) and "RuntimeError: real" in outcome.message  # a real error stays a failure
