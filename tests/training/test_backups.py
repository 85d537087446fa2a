"""Backups belong to their run, sort by step, are checked before use and load without running code."""

from __future__ import annotations

import json
import os
import pickle
import re
from pathlib import Path

import pytest
import torch

from onetrainer.config import config_from_dict
from onetrainer.training.checkpoint import (
    BackupDamaged,
    TrainProgress,
    best_backup,
    check_complete,
    list_backups,
    read_progress,
    restore_backup,
    run_identity,
    write_backup,
)
from onetrainer.util.fs import remove_leftovers
from tests.helpers import tiny_config


class FakeMethod:
    """Writes and reads one weight file, as the real methods do."""

    def __init__(self) -> None:
        self.weight = torch.nn.Parameter(torch.ones(3))

    def save_backup(self, folder: Path) -> None:
        torch.save({"w": self.weight.detach()}, folder / "weights.pt")

    def load_backup(self, folder: Path) -> None:
        self.weight.data.copy_(torch.load(folder / "weights.pt", weights_only=True)["w"])


def setup(tmp_path: Path, lr: float = 1e-3, concept: str = "images"):
    config, _ = config_from_dict(tiny_config(tmp_path, learning_rate=lr, concepts=[{"path": str(tmp_path / concept)}]))
    method = FakeMethod()
    optimizer = torch.optim.AdamW([{"params": [method.weight], "lr": lr, "name": "w"}])
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))
    return config, method, optimizer, scheduler


def backup(root: Path, setup_, step: int, keep: int | None = None, loss: float | None = None, best=False) -> Path:
    config, method, optimizer, scheduler = setup_
    validation = {"loss": loss, "step": step} if loss is not None else None
    progress = TrainProgress(0, step, step)
    return write_backup(root, method, optimizer, scheduler, progress, config, None, keep, validation, best)


def fake_backup(root: Path, name: str, step: int, written_at: float, identity: str | None = None) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    meta = {"progress": {"epoch": 0, "epoch_step": step, "global_step": step}, "written_at": written_at}
    if identity:
        meta["run_identity"] = identity
    (folder / "meta.json").write_text(json.dumps(meta))
    return folder


def test_backups_sort_by_time_then_numeric_step_not_by_name(tmp_path):
    # Written in the same second: by name, backup-10 would come before backup-9.
    fake_backup(tmp_path, "2026-01-01_00-00-00-backup-10-1-0", 10, 2.0)
    fake_backup(tmp_path, "2026-01-01_00-00-00-backup-9-0-9", 9, 1.0)
    assert [read_progress(b).global_step for b in list_backups(tmp_path)] == [9, 10]


def test_resume_and_rolling_cleanup_see_only_their_own_runs_backups(tmp_path):
    root = tmp_path / "backup"
    mine, other = setup(tmp_path, concept="cats"), setup(tmp_path, concept="dogs")
    assert run_identity(mine[0]) != run_identity(other[0])
    theirs = [backup(root, other, step) for step in (1, 2)]
    for step in (1, 2, 3):
        backup(root, mine, step, keep=2)
    own = list_backups(root, run_identity(mine[0]))
    assert [read_progress(b).global_step for b in own] == [2, 3]  # the rolling window of this run only
    assert all(p.is_dir() for p in theirs)  # the other run's backups are untouched
    assert list_backups(root, run_identity(other[0])) == theirs


def test_keep_best_spares_the_lowest_validation_loss_from_the_rolling_window(tmp_path):
    root, mine = tmp_path / "backup", setup(tmp_path)
    losses = {1: 0.5, 2: 0.2, 3: 0.4, 4: 0.2, 5: 0.3}  # step 2 is the best (the earlier of two equal losses)
    for step, loss in losses.items():
        backup(root, mine, step, keep=2, loss=loss, best=True)
    kept = list_backups(root, run_identity(mine[0]))
    assert [read_progress(b).global_step for b in kept] == [2, 4, 5]
    assert best_backup(root, run_identity(mine[0])) == kept[0]
    assert json.loads((kept[0] / "meta.json").read_text())["validation"] == {"loss": 0.2, "step": 2}
    backup(root, mine, 6, keep=2, loss=0.1)  # without keep_best the window alone decides
    assert [read_progress(b).global_step for b in list_backups(root, run_identity(mine[0]))] == [5, 6]


def test_a_cut_short_or_missing_file_is_named(tmp_path):
    folder = backup(tmp_path, setup(tmp_path), 1)
    check_complete(folder)
    weights = folder / "weights.pt"
    weights.write_bytes(weights.read_bytes()[:20])
    try:
        check_complete(folder)
        raise AssertionError("a cut-short file must be found")
    except BackupDamaged as e:
        assert str(weights) in str(e) and "cut short" in str(e)
    weights.unlink()
    try:
        restore_backup(folder, *setup(tmp_path)[1:])
        raise AssertionError("a missing file must be found")
    except BackupDamaged as e:
        assert str(weights) in str(e) and "missing" in str(e)


class Exploit:
    def __reduce__(self):
        return (os.system, (f"touch {MARKER}",))


MARKER = ""


def test_a_crafted_rng_file_does_not_run_code_and_the_configured_learning_rate_wins(tmp_path):
    global MARKER
    MARKER = str(tmp_path / "pwned")
    folder = backup(tmp_path / "backup", setup(tmp_path, lr=1e-3), 5)
    (folder / "rng.pt").write_bytes(pickle.dumps(Exploit()))
    meta = json.loads((folder / "meta.json").read_text())
    meta["files"]["rng.pt"] = (folder / "rng.pt").stat().st_size  # an attacker can write the sizes too
    (folder / "meta.json").write_text(json.dumps(meta))

    _, method, optimizer, scheduler = setup(tmp_path, lr=5e-4)  # the user lowered the learning rate
    progress, _, warnings = restore_backup(folder, method, optimizer, scheduler)
    assert progress.global_step == 5
    assert not Path(MARKER).exists()
    assert any("rng.pt" in w and "cannot be read safely" in w for w in warnings)
    # The schedule continues at its step with the configured base rate (5e-4 / (1 + 0): the fake backup's scheduler
    # was never stepped), not the backup's 1e-3.
    assert optimizer.param_groups[0]["lr"] == 5e-4 and scheduler.base_lrs == [5e-4]


def test_leftovers_of_dead_writers_are_removed_and_live_ones_kept(tmp_path):
    dead = tmp_path / ".lora.safetensors.pid999999999-ab12cd34.tmp"
    dead.write_bytes(b"half")
    dead_dir = tmp_path / ".2026-backup-1-0-1.pid999999999-ab12cd34.tmp"
    dead_dir.mkdir()
    (dead_dir / "optimizer.pt").write_bytes(b"half")
    live = tmp_path / f".model.safetensors.pid{os.getpid()}-ab12cd34.tmp"
    live.write_bytes(b"being written")
    user = tmp_path / ".hidden.tmp"
    user.write_bytes(b"not ours")
    assert sorted(remove_leftovers(tmp_path)) == sorted([dead, dead_dir])
    assert live.exists() and user.exists() and not dead.exists() and not dead_dir.exists()


def test_a_resumed_optimizer_keeps_its_float32_state_beside_bfloat16_weights(tmp_path):
    """Adafactor keeps float32 second moments for BFLOAT_16 weights; torch's load_state_dict would round them to
    bfloat16, and a resumed BFLOAT_16 fine-tune would drift from the run it continues."""
    from transformers.optimization import Adafactor

    def bf16_setup():
        config, method, _, _ = setup(tmp_path)
        method.weight = torch.nn.Parameter(torch.linspace(0.5, 1.5, 12, dtype=torch.bfloat16).view(3, 4))
        opt = Adafactor([{"params": [method.weight], "name": "w"}], lr=1e-3, scale_parameter=False, relative_step=False)
        return config, method, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)

    saved = bf16_setup()
    saved[1].weight.grad = torch.full((3, 4), 1e-3 / 3, dtype=torch.bfloat16)
    saved[2].step()
    moments = {k: v.clone() for k, v in saved[2].state[saved[1].weight].items() if isinstance(v, torch.Tensor)}
    assert moments and all(v.dtype == torch.float32 for v in moments.values())
    folder = backup(tmp_path / "backup", saved, 1)

    _, method, optimizer, scheduler = resumed = bf16_setup()
    restore_backup(folder, method, optimizer, scheduler)
    state = optimizer.state[resumed[1].weight]
    assert all(state[k].dtype == torch.float32 and torch.equal(state[k], v) for k, v in moments.items())


class PartsMethod:
    """A fine-tune's parts as `checkpoint` sees them: `model.part(name)`, `trained_parts()`."""

    def __init__(self, parts: dict[str, torch.nn.Module]) -> None:
        self.parts = parts
        self.model = self

    def part(self, name: str) -> torch.nn.Module:
        return self.parts[name]

    def trained_parts(self) -> list[str]:
        return list(self.parts)


def test_a_sharded_backup_resumes_whole_in_one_process_with_its_weights_and_optimizer_state(tmp_path):
    """A sharded backup's DCP shards (written here by one process in the form `ShardedParts.write_state` gives them:
    every tensor named part.path, the optimizer's state by the same names) load into an unsharded run without a
    process group: weights and AdamW's moments equal, the schedule at its step. A run that trains a part the shards
    do not hold is refused with the backup's name and why, not skipped as damaged."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    from onetrainer.training.checkpoint import BackupMismatch

    def run(seed: int, parts=("denoiser", "encoder")):
        torch.manual_seed(seed)
        modules = {"denoiser": torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Linear(6, 2)),
                   "encoder": torch.nn.Linear(3, 4)}  # fmt: skip
        method = PartsMethod({name: modules[name] for name in parts})
        params = [{"params": list(m.parameters()), "name": n, "lr": 1e-2} for n, m in method.parts.items()]
        optimizer = torch.optim.AdamW(params)
        return method, optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))

    method, optimizer, scheduler = run(0)
    for _ in range(3):
        loss = method.part("denoiser")(method.part("encoder")(torch.randn(5, 3))).square().mean()
        loss.backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
    shards = tmp_path / "backup" / ".sharded.tmp"
    model_state, optimizer_state = get_state_dict(torch.nn.ModuleDict(method.parts), optimizer)
    dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=shards, no_dist=True)
    config, _ = config_from_dict(tiny_config(tmp_path))
    folder = write_backup(
        tmp_path / "backup", None, optimizer, scheduler, TrainProgress(0, 3, 3), config, sharded=(shards, 2)
    )
    assert json.loads((folder / "meta.json").read_text())["sharded"] == {"processes": 2}

    resumed, resumed_optimizer, resumed_scheduler = run(1)
    progress, _, warnings = restore_backup(folder, resumed, resumed_optimizer, resumed_scheduler)
    assert progress.global_step == 3 and warnings == []
    pairs = [(p, q) for name in method.parts for p, q in zip(method.part(name).parameters(),
                                                              resumed.part(name).parameters())]  # fmt: skip
    assert all(torch.equal(p, q) for p, q in pairs)
    for p, q in pairs:
        saved, loaded = optimizer.state[p], resumed_optimizer.state[q]
        assert saved.keys() == loaded.keys() == {"step", "exp_avg", "exp_avg_sq"}
        assert all(torch.equal(saved[k], loaded[k]) for k in saved)
    assert resumed_scheduler.last_epoch == 3 and resumed_optimizer.param_groups[0]["lr"] == pytest.approx(1e-2 / 4)

    # Written by a run that trained only the denoiser, resumed by one that trains the encoder too: named, refused.
    method, optimizer, scheduler = run(0, parts=("denoiser",))
    shards = tmp_path / "backup" / ".sharded.tmp"
    model_state, optimizer_state = get_state_dict(torch.nn.ModuleDict(method.parts), optimizer)
    dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=shards, no_dist=True)
    partial = write_backup(
        tmp_path / "partial", None, optimizer, scheduler, TrainProgress(0, 1, 1), config, sharded=(shards, 2)
    )
    with pytest.raises(BackupMismatch, match=rf"backup {re.escape(partial.name)} \(the shards of 2 processes\) "
                       r"cannot be resumed by this run \(unsharded\): .*encoder") as refused:  # fmt: skip
        restore_backup(partial, run(1)[0], *run(1)[1:])
    assert "start fresh without 'Continue from last backup'" in str(refused.value)
