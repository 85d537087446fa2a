"""Backups (everything needed to go on) and resuming from them.

A backup folder `workspace/backup/<time>-backup-<step>-<epoch>-<epoch step>/` holds the trained weights (adapters,
weights or embeddings, written by the method), `optimizer.pt` (optimizer and LR-scheduler state), `rng.pt`,
`config.json` and `meta.json` with the progress, the run's identity and the size of every file. It is written into a
temporary folder and renamed, so a crash never leaves a half backup that resume would pick up; a backup damaged later
(a copy cut short, a file deleted) fails the size check and is skipped for the next older one.

A backup belongs to a run identity (`run_identity`: model type, method, base model and concept folders), so runs
sharing a workspace never resume from, or clean up, each other's backups. `optimizer.pt` and `rng.pt` are read with
`weights_only=True`: a crafted file cannot run code.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
import math
import os
import random
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from onetrainer.training.sharding import SHARDED_STATE
from onetrainer.util.fs import atomic_directory

if TYPE_CHECKING:
    from onetrainer.config import TrainConfig

log = logging.getLogger(__name__)

META = "meta.json"
FORMAT_VERSION = 2


class BackupDamaged(Exception):
    """A backup that cannot be restored (a file missing, cut short or unreadable); the message names it."""


class BackupMismatch(RuntimeError):
    """A backup that does not hold what this run trains, where the backup or the run is sharded (a part trained now
    and not then; an optimizer group of another size); the message names the backup and why."""


@dataclass
class TrainProgress:
    epoch: int = 0  # the epoch being trained (0-based)
    epoch_step: int = 0  # optimizer steps done in that epoch
    global_step: int = 0  # optimizer steps done in the run

    def suffix(self) -> str:
        return f"{self.global_step}-{self.epoch}-{self.epoch_step}"


def run_identity(config: TrainConfig) -> str:
    """What makes backups "this run's": the model type, training method, base model and concept folders. Settings
    (the learning rate, the output path after a failed save…) may change between a run and its resumption; they are
    compared and reported separately."""
    folders = sorted(c.path for c in (config.concepts or []) if c.enabled)
    text = json.dumps([config.model_type.value, config.training_method.value, config.base_model_name, folders])
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def write_backup(
    backup_root: Path,
    method,
    optimizer,
    lr_scheduler,
    progress: TrainProgress,
    config: TrainConfig,
    extra_state: dict | None = None,
    keep: int | None = None,
    validation: dict | None = None,
    keep_best: bool = False,
    sharded: tuple[Path, int] | None = None,
) -> Path:
    """Write a backup of the run's state; with `keep`, delete this run's older backups beyond the newest `keep` (but
    with `keep_best`, never the one with the lowest validation loss). `validation` ({"loss", "step"}) is recorded in
    its `meta.json`. A sharded run's (`sharded`: the DCP folder its processes wrote, and how many they were) holds
    that folder as `sharded/` instead of the method's files and the optimizer's state, which are in it."""
    stamp = datetime.datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
    target = backup_root / f"{stamp}-backup-{progress.suffix()}"
    suffix = 1
    while target.exists():  # two backups in one second (a small model, "backup now")
        suffix += 1
        target = backup_root / f"{stamp}-backup-{progress.suffix()}-{suffix}"
    identity = run_identity(config)
    with atomic_directory(target) as tmp:
        if sharded is None:
            method.save_backup(tmp)
            optimizer_state = {"optimizer": optimizer.state_dict()}
        else:
            os.replace(sharded[0], tmp / SHARDED_STATE)
            optimizer_state = {}
        torch.save(
            {
                **optimizer_state,
                "lr_scheduler": lr_scheduler.state_dict(),
                "group_names": [g.get("name") for g in optimizer.param_groups],
                **(extra_state or {}),
            },
            tmp / "optimizer.pt",
        )
        torch.save(_rng_state(), tmp / "rng.pt")
        (tmp / "config.json").write_text(json.dumps(config.to_dict(), indent=2), encoding="utf-8")
        files = {p.relative_to(tmp).as_posix(): p.stat().st_size for p in sorted(tmp.rglob("*")) if p.is_file()}
        meta = {
            "format": FORMAT_VERSION,
            "progress": asdict(progress),
            "run_identity": identity,
            "written_at": time.time(),
            "model_type": config.model_type.value,
            "training_method": config.training_method.value,
            "base_model_name": config.base_model_name,
            "files": files,
        }
        if validation is not None:
            meta["validation"] = validation
        if sharded is not None:
            meta["sharded"] = {"processes": sharded[1]}
        (tmp / META).write_text(json.dumps(meta, indent=2), encoding="utf-8")
    if keep:
        # Only this run's backups take part in the rolling window: another config's backups are never deleted.
        kept = best_backup(backup_root, identity) if keep_best else None
        for old in list_backups(backup_root, identity)[:-keep]:
            if old != kept:
                shutil.rmtree(old, ignore_errors=True)
    return target


def validation_loss(backup: Path) -> float | None:
    """The validation loss recorded in a backup's `meta.json` (None when it has none)."""
    try:
        loss = read_meta(backup).get("validation", {}).get("loss")
    except (OSError, ValueError, AttributeError):
        return None
    return float(loss) if isinstance(loss, int | float) and math.isfinite(loss) else None


def best_backup(backup_root: Path, identity: str) -> Path | None:
    """This run identity's backup with the lowest validation loss (the earliest of equal ones); None when none has
    one."""
    best: tuple[float, Path] | None = None
    for path in list_backups(backup_root, identity):  # oldest first
        loss = validation_loss(path)
        if loss is not None and (best is None or loss < best[0]):
            best = (loss, path)
    return best[1] if best is not None else None


def read_meta(backup: Path) -> dict:
    return json.loads((backup / META).read_text(encoding="utf-8"))


def list_backups(backup_root: Path, identity: str | None = None) -> list[Path]:
    """Complete backups, oldest first (by the time they were written, then by step: `backup-9` before `backup-10`).

    With `identity`, only the backups of that run identity (`run_identity`); backups written before identities were
    recorded count as anyone's.
    """
    if not backup_root.is_dir():
        return []
    found = []
    for path in backup_root.iterdir():
        if not path.is_dir() or path.name.startswith(".") or not (path / META).is_file():
            continue
        try:
            meta = read_meta(path)
        except (OSError, ValueError) as e:
            log.warning("%s: unreadable %s (%s); ignored", path, META, e)
            continue
        if identity is not None and meta.get("run_identity", identity) != identity:
            continue
        written = meta.get("written_at")
        if not isinstance(written, int | float):
            written = (path / META).stat().st_mtime
        step = meta.get("progress", {}).get("global_step", 0)
        found.append((written, step, path.name, path))
    return [entry[-1] for entry in sorted(found)]


def read_progress(backup: Path) -> TrainProgress:
    return TrainProgress(**read_meta(backup)["progress"])


def check_complete(backup: Path) -> None:
    """Raise `BackupDamaged` naming the first file that is missing or has another size than when it was written."""
    try:
        meta = read_meta(backup)
    except (OSError, ValueError) as e:
        raise BackupDamaged(f"{backup / META} cannot be read ({e})") from e
    expected = meta.get("files") or {"optimizer.pt": None}
    for name, size in expected.items():
        path = backup / name
        if not path.is_file():
            raise BackupDamaged(f"{path} is missing")
        if size is not None and path.stat().st_size != size:
            raise BackupDamaged(f"{path} is cut short or damaged ({path.stat().st_size} bytes, {size} written)")


def backup_settings(backup: Path) -> dict:
    """The config the backup was written with (empty when it cannot be read)."""
    try:
        return json.loads((backup / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def restore_backup(
    backup: Path, method, optimizer, lr_scheduler, sharded=None, ema=None
) -> tuple[TrainProgress, dict, list[str]]:
    """Load a backup into a freshly set-up run; returns the progress, the extra state and warnings.

    Raises `BackupDamaged` (before loading anything when a file is missing or cut short), `BackupMismatch` when the
    backup does not hold what this run trains (its message names the backup and why). The learning rates stay the
    config's (LR schedules of ours): the backup brings the weights, the optimizer's moments, the schedule's position
    and the random state; an optimizer of other parameter groups starts fresh, with a warning.

    Sharded or not, a backup resumes in either mode and on any number of processes (`sharded`: this run's
    `sharding.ShardedParts`, or None): a sharded backup's DCP shards are read by every process of a sharded run, each
    its share (DCP reshards when the count differs: `ShardedParts.read_state`), or whole by each process of an
    unsharded one (`sharding.read_state_whole`, no collective); an unsharded backup's full weights and optimizer state
    are split by a sharded run (`ShardedParts.read_whole_state`), or loaded by the method as always. A sharded
    backup's EMA average is in its shards too, read into `ema` (the run's `training.ema.EMA`, or None) here; the caller
    loads the returned state's `ema` entry (the count of updates, and an unsharded backup's average) into it.
    """
    check_complete(backup)
    warnings: list[str] = []
    try:
        state = torch.load(backup / "optimizer.pt", map_location="cpu", weights_only=True)
    except Exception as e:  # a damaged zip, or a pickle that asks for more than tensors and plain values
        raise BackupDamaged(f"{backup / 'optimizer.pt'} cannot be read safely ({e})") from e
    names = [g.get("name") for g in optimizer.param_groups]
    same_groups = state.get("group_names") == names
    if not same_groups:
        warnings.append(
            f"the optimizer state in {backup.name} is for other parameter groups ({state.get('group_names')}); "
            "it starts fresh"
        )
    configured = _configured_rates(optimizer, lr_scheduler)
    written = read_meta(backup).get("sharded")
    if written is not None or sharded is not None:
        in_shards = ema if (state.get("ema") or {}).get("in_shards") else None
        _restore_sharding(backup, written, method, optimizer if same_groups else None, state, sharded, in_shards)
    else:
        try:
            method.load_backup(backup)
        except Exception as e:
            raise BackupDamaged(f"the trained weights in {backup} cannot be read ({e})") from e
        if same_groups:
            optimizer.load_state_dict(state["optimizer"])
            _keep_saved_state_dtypes(optimizer, state["optimizer"])
    if same_groups:
        lr_scheduler.load_state_dict(state["lr_scheduler"])
        _restore_configured_rates(optimizer, lr_scheduler, configured)
    _restore_rng(backup, warnings)
    return read_progress(backup), state, warnings


def _restore_sharding(backup: Path, written: dict | None, method, optimizer, state: dict, sharded, ema=None) -> None:
    """`restore_backup`'s weights and optimizer state where the backup or the run is sharded (`optimizer` None: the
    weights alone), and the EMA's average where the backup's shards hold it (`ema`: the run's EMA, else None). A
    backup that does not hold what this run trains is a `BackupMismatch` naming it and why."""
    from torch.distributed.checkpoint.api import CheckpointException

    from onetrainer.training.sharding import read_state_whole

    mode = f"sharded on {sharded.dist.world_size} processes" if sharded is not None else "unsharded"
    try:
        if written is not None and sharded is not None:
            sharded.read_state(backup / SHARDED_STATE, optimizer, ema)
        elif written is not None:
            parts = {name: method.model.part(name) for name in method.trained_parts()}
            read_state_whole(parts, backup / SHARDED_STATE, optimizer, ema)
        else:
            if not hasattr(method, "backup_states"):
                raise ValueError("a sharded run resumes a fine-tune's backup only")
            states = method.backup_states(backup)
            sharded.read_whole_state(states, state.get("optimizer") if optimizer is not None else None, optimizer)
    except (BackupDamaged, BackupMismatch):
        raise
    except (Exception, CheckpointException) as e:  # DCP's is a BaseException, holding each process's failure
        what = f"the shards of {written.get('processes')} processes" if written is not None else "an unsharded run's"
        cause = next(iter(getattr(e, "failures", {}).values()), e)
        reason = str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__
        raise BackupMismatch(
            f"backup {backup.name} ({what}) cannot be resumed by this run ({mode}): {reason}. It holds the parts "
            "the run that wrote it trained: train the same parts, or start fresh without 'Continue from last backup'"
        ) from e


def _restore_rng(backup: Path, warnings: list[str]) -> None:
    rng = backup / "rng.pt"
    if rng.is_file():
        try:
            _set_rng_state(torch.load(rng, map_location="cpu", weights_only=True))
        except Exception as e:
            warnings.append(f"{rng} cannot be read safely ({type(e).__name__}); the random state starts fresh")


def _keep_saved_state_dtypes(optimizer, saved: dict) -> None:
    """torch's `load_state_dict` casts floating state to its weight's dtype, but an optimizer may keep it in another:
    Adafactor's second moments are float32 beside BFLOAT_16 weights, and rounded to bfloat16 on resume the run would
    no longer continue as it would have. Each state tensor gets its saved dtype back (on the device it was put on)."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    for index, entries in saved.get("state", {}).items():
        if not isinstance(index, int) or index >= len(params):
            continue
        current = optimizer.state.get(params[index])
        if not current:
            continue
        for key, value in entries.items():
            now = current.get(key)
            if isinstance(value, torch.Tensor) and isinstance(now, torch.Tensor) and now.dtype != value.dtype:
                current[key] = value.to(device=now.device)


def _schedulers(lr_scheduler) -> list:
    return [lr_scheduler, *getattr(lr_scheduler, "_schedulers", [])]  # SequentialLR holds the warmup and the main one


def _configured_rates(optimizer, lr_scheduler) -> tuple[list, list]:
    initial = [g.get("initial_lr") for g in optimizer.param_groups]
    return initial, [list(getattr(s, "base_lrs", [])) for s in _schedulers(lr_scheduler)]


def _restore_configured_rates(optimizer, lr_scheduler, configured: tuple[list, list]) -> None:
    """Put the config's learning rates back after loading states that carry the backup's: the schedule continues
    from the restored step with the configured base rates."""
    import warnings

    active = lr_scheduler
    if hasattr(lr_scheduler, "_schedulers"):
        active = lr_scheduler._schedulers[sum(lr_scheduler.last_epoch >= m for m in lr_scheduler._milestones)]
    if not isinstance(active, torch.optim.lr_scheduler.LambdaLR):
        return  # a custom or optimizer-driven schedule (Adafactor) keeps the state it saved
    initial, base_lrs = configured
    for group, value in zip(optimizer.param_groups, initial):
        if value is not None:
            group["initial_lr"] = value
    for scheduler, rates in zip(_schedulers(lr_scheduler), base_lrs):
        if rates:
            scheduler.base_lrs = rates
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # get_lr outside step() is what we mean here
        rates = active.get_lr()
    for group, rate in zip(optimizer.param_groups, rates):
        group["lr"] = rate
    for scheduler in _schedulers(lr_scheduler):
        scheduler._last_lr = list(rates)


def differing_settings(saved: dict, current: dict, prefix: str = "") -> list[tuple[str, object, object]]:
    """(path, backup's value, config's value) for every setting that differs, skipping run bookkeeping and the
    settings the backup's version did not have yet (they hold their defaults: nothing changed)."""
    skip = {"continue_last_backup", "concepts", "samples", "__version"}
    out: list[tuple[str, object, object]] = []
    for key in sorted(set(saved) | set(current)):
        if (not prefix and key in skip) or (saved and key not in saved):
            continue
        a, b = saved.get(key), current.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += differing_settings(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append((f"{prefix}{key}", a, b))
    return out


def _rng_state() -> dict:
    # Only tensors and plain values, so that the file loads with weights_only=True.
    version, internal, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "python": [version, torch.tensor(internal, dtype=torch.int64), gauss],
        "numpy": [name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(int(v) for v in internal.tolist()), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
