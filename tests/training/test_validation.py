"""Validation that says which checkpoint to keep: fixed draws per range, held-out images, every checkpoint's loss in
`validation.json` and its header, the best one marked and kept by the rolling window."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest
from safetensors import safe_open

from onetrainer.config import config_from_dict
from onetrainer.data.preflight import preflight_report
from onetrainer.training.checkpoint import best_backup, list_backups, read_meta
from onetrainer.training.events import BestCheckpoint, Metrics, Status, Validated, describe
from onetrainer.training.validation import (
    FILE_NAME,
    LOSS_METADATA_KEY,
    RANGES,
    Checkpoint,
    ValidationRecord,
    combine,
    range_fractions,
)
from tests.helpers import image_folder, read_scalars, run_config, tiny_config

RANGE_TAGS = [f"validation/loss_t{low}-{high}" for low, high in RANGES]


def test_the_ranges_cover_the_schedule_and_the_result_averages_in_order():
    assert RANGES[0][0] == 0 and RANGES[-1][1] == 1000
    assert all(a[1] == b[0] for a, b in itertools.pairwise(RANGES))
    assert range_fractions().tolist() == [0.125, 0.375, 0.625, 0.875]
    result = combine([("a", [1.0, 2.0, 3.0, 4.0]), ("b", [3.0, 2.0, 1.0, 0.0]), ("a", [2.0, 2.0, 2.0, 2.0])], 9, 3, 0)
    assert result.loss == pytest.approx(2.0)
    assert result.ranges == pytest.approx({"t0-250": 2.0, "t250-500": 2.0, "t500-750": 2.0, "t750-1000": 2.0})
    assert result.concepts == pytest.approx({"a": 2.25, "b": 1.5})
    scalars = result.scalars()
    assert scalars["validation/loss"] == result.loss and scalars["loss/validation_step/total_average"] == 1.875
    assert set(RANGE_TAGS) <= scalars.keys()


def test_the_record_names_the_best_checkpoint_of_the_run_and_of_what_it_resumed(tmp_path):
    def checkpoint(kind, step, loss, run_path=True):
        path = tmp_path / f"{kind}-{step}"
        if run_path:
            path.touch()
        return Checkpoint(kind, str(path), step, step // 2, step % 2, loss, step)

    first, _ = ValidationRecord.open(tmp_path, "run-1", "same")
    assert first.add_checkpoint(checkpoint("save", 2, 0.5)).step == 2
    assert first.add_checkpoint(checkpoint("backup", 4, 0.3)).step == 4
    assert first.add_checkpoint(checkpoint("save", 6, 0.4)) is None
    assert first.add_checkpoint(checkpoint("save", 8, 0.1, run_path=False)) is None  # a gone file is no choice
    first.write()
    best = first.best()
    assert (best.step, best.label) == (4, "epoch 2")

    # A run resuming from the step-4 backup inherits the checkpoints up to there; a fresh run of the config does not.
    resumed, problem = ValidationRecord.open(tmp_path, "run-2", "same")
    assert problem is None
    resumed.resumed(4)
    assert resumed.best().step == 4
    assert resumed.add_checkpoint(checkpoint("save", 5, 0.35)) is None
    assert resumed.add_checkpoint(checkpoint("save", 7, 0.25)).step == 7
    assert resumed.best().label == "step 7 (epoch 4)"
    fresh, _ = ValidationRecord.open(tmp_path, "run-3", "same")
    assert fresh.best() is None
    other, _ = ValidationRecord.open(tmp_path, "run-4", "another config")
    other.resumed(10)
    assert other.best() is None


def test_an_unreadable_record_is_kept_aside_and_a_new_one_started(tmp_path):
    (tmp_path / FILE_NAME).write_text("{not json", encoding="utf-8")
    record, problem = ValidationRecord.open(tmp_path, "run", "id")
    assert str(tmp_path / FILE_NAME) in problem and "validation.json.unreadable" in problem
    assert (tmp_path / f"{FILE_NAME}.unreadable").read_text(encoding="utf-8") == "{not json"
    record.write()
    assert json.loads((tmp_path / FILE_NAME).read_text(encoding="utf-8"))["checkpoints"] == []


def _validated_run(root: Path, images: Path) -> dict:
    data = tiny_config(
        root,
        epochs=3,
        learning_rate=1e-2,
        validation=True,
        validate_after=1,
        validate_after_unit="EPOCH",
        validation_holdout=2,
        save_every=1,
        save_every_unit="EPOCH",
        backup_after=1,
        backup_after_unit="EPOCH",
        rolling_backup=True,
        rolling_backup_count=1,
        keep_best=True,
        concepts=[{"name": "shapes", "path": str(images), "seed": 7}],
    )
    return data


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """The same validated run twice (same seed), each in its own workspace."""
    root = tmp_path_factory.mktemp("validation")
    images = image_folder(root, count=6)
    runs = []
    for name in ("a", "b"):
        data = _validated_run(root / name, images)
        runs.append((data, run_config(data)))
    return runs


def test_two_runs_with_the_same_seed_give_the_same_curves(two_runs):
    (_, first), (_, second) = two_runs
    curves = [
        [(e.global_step, e.loss, e.ranges) for e in events if isinstance(e, Validated)] for events in (first, second)
    ]
    assert curves[0] == curves[1]  # exactly: fixed noise, fixed times, the same weights
    assert [step for step, _, _ in curves[0]] == [2, 4, 6]  # 4 trained images (2 held out), batch 2: 2 steps an epoch
    losses = [loss for _, loss, _ in curves[0]]
    assert len(set(losses)) == 3  # the curve moves as the model does
    for _, loss, ranges in curves[0]:
        assert list(ranges) == ["t0-250", "t250-500", "t500-750", "t750-1000"]
        assert loss == pytest.approx(sum(ranges.values()) / 4)
        assert len(set(ranges.values())) == 4
    assert len([e for e in first if isinstance(e, Metrics)]) == 6  # the held-out images are never trained
    # One validation per epoch: the save, the backup and the final model at its step record it, not measure again.
    assert [e.text for e in first if isinstance(e, Status)].count("validating") == 3


def test_tensorboard_has_the_mean_and_each_range(two_runs):
    data, _ = two_runs[0]
    scalars = read_scalars(Path(data["workspace_dir"]) / "tensorboard")
    for tag in ["validation/loss", *RANGE_TAGS, "loss/validation_step/shapes"]:
        assert [step for step, _ in scalars[tag]] == [2, 4, 6], tag


def test_every_checkpoint_records_its_loss_and_the_best_is_marked_and_kept(two_runs):
    data, events = two_runs[0]
    workspace = Path(data["workspace_dir"])
    record = json.loads((workspace / FILE_NAME).read_text(encoding="utf-8"))
    validations = {v["step"]: v["loss"] for v in record["validations"]}
    kinds = [(c["kind"], c["step"]) for c in record["checkpoints"]]
    assert kinds == [("backup", 2), ("save", 2), ("backup", 4), ("save", 4), ("backup", 6), ("save", 6), ("final", 6)]
    for entry in record["checkpoints"]:
        assert entry["loss"] == validations[entry["step"]] and entry["validated_at"] == entry["step"]

    # Saves carry their loss in the file's header, backups in their meta.json.
    for entry in record["checkpoints"]:
        if entry["kind"] in ("save", "final"):
            with safe_open(entry["path"], "pt") as f:
                assert float(f.metadata()[LOSS_METADATA_KEY]) == pytest.approx(entry["loss"], rel=1e-5)

    # The app's marker is the checkpoint with the lowest loss (the earliest of equal ones), and it is the record's.
    lowest = min(record["checkpoints"], key=lambda c: (c["loss"], c["step"]))
    marked = [e for e in events if isinstance(e, BestCheckpoint)][-1]
    assert marked.path == lowest["path"] and marked.loss == lowest["loss"]
    (recorded_best,) = record["best"].values()
    assert recorded_best["path"] == lowest["path"]
    assert describe(marked).startswith(f"best: {marked.label}, loss {marked.loss:.4f}")

    # Rolling backups keep 1, and keep_best spares the best backup when that is not the newest.
    backups = list_backups(workspace / "backup")
    written = [e for e in record["checkpoints"] if e["kind"] == "backup"]
    best = min(written, key=lambda e: (e["loss"], e["step"]))["path"]
    assert best_backup(workspace / "backup", read_meta(backups[-1])["run_identity"]) == Path(best)
    assert {str(b) for b in backups} == {best, written[-1]["path"]}
    assert all(math.isfinite(read_meta(b)["validation"]["loss"]) for b in backups)


def test_the_preflight_names_the_held_out_images(two_runs):
    data, _ = two_runs[0]
    config, _ = config_from_dict(data)
    report = preflight_report(config)
    (concept,) = report.concepts
    assert concept.images == 6 and len(concept.held_out) == 2
    assert f"2 held out for validation, not trained: {Path(concept.held_out[0]).name}" in report.text()
    assert report.steps_per_epoch == 2
    # The same images every time, and none without validation on.
    assert preflight_report(config).concepts[0].held_out == concept.held_out
    config.validation = False
    assert preflight_report(config).concepts[0].held_out == []
