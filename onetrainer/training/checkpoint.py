"""Backups (everything needed to go on) and resuming from them.

A backup folder `workspace/backup/<time>-backup-<step>-<epoch>-<epoch step>/` holds the trained weights (adapters,
weights or embeddings, written by the method), `optimizer.pt` (optimizer and LR-scheduler state), `rng.pt`,
`config.json` and `meta.json` with the progress. It is written into a temporary folder and renamed, so a crash never
leaves a half backup that resume would pick up.
"""

from __future__ import annotations

import datetime
import json
import logging
import random
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from onetrainer.util.fs import atomic_directory

log = logging.getLogger(__name__)

META = "meta.json"
FORMAT_VERSION = 1


@dataclass
class TrainProgress:
    epoch: int = 0  # the epoch being trained (0-based)
    epoch_step: int = 0  # optimizer steps done in that epoch
    global_step: int = 0  # optimizer steps done in the run

    def suffix(self) -> str:
        return f"{self.global_step}-{self.epoch}-{self.epoch_step}"


def write_backup(
    backup_root: Path,
    method,
    optimizer,
    lr_scheduler,
    progress: TrainProgress,
    config,
    extra_state: dict | None = None,
    keep: int | None = None,
) -> Path:
    stamp = datetime.datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
    target = backup_root / f"{stamp}-backup-{progress.suffix()}"
    with atomic_directory(target) as tmp:
        method.save_backup(tmp)
        torch.save(
            {
                "optimizer": optimizer.state_dict(),
                "lr_scheduler": lr_scheduler.state_dict(),
                "group_names": [g.get("name") for g in optimizer.param_groups],
                **(extra_state or {}),
            },
            tmp / "optimizer.pt",
        )
        torch.save(_rng_state(), tmp / "rng.pt")
        (tmp / "config.json").write_text(json.dumps(config.to_dict(), indent=2), encoding="utf-8")
        meta = {
            "format": FORMAT_VERSION,
            "progress": asdict(progress),
            "model_type": config.model_type.value,
            "training_method": config.training_method.value,
            "base_model_name": config.base_model_name,
        }
        (tmp / META).write_text(json.dumps(meta, indent=2), encoding="utf-8")
    if keep:
        for old in list_backups(backup_root)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    return target


def list_backups(backup_root: Path) -> list[Path]:
    """Complete backups, oldest first (their names start with the time they were written)."""
    if not backup_root.is_dir():
        return []
    return sorted(
        p for p in backup_root.iterdir() if p.is_dir() and (p / META).is_file() and not p.name.startswith(".")
    )


def read_progress(backup: Path) -> TrainProgress:
    meta = json.loads((backup / META).read_text(encoding="utf-8"))
    return TrainProgress(**meta["progress"])


def restore_backup(backup: Path, method, optimizer, lr_scheduler) -> tuple[TrainProgress, dict, list[str]]:
    """Load a backup into a freshly set-up run; returns the progress, the extra state and warnings."""
    warnings: list[str] = []
    method.load_backup(backup)
    state = torch.load(backup / "optimizer.pt", map_location="cpu", weights_only=False)
    names = [g.get("name") for g in optimizer.param_groups]
    if state.get("group_names") == names:
        optimizer.load_state_dict(state["optimizer"])
        lr_scheduler.load_state_dict(state["lr_scheduler"])
    else:
        warnings.append(
            f"the optimizer state in {backup.name} is for other parameter groups ({state.get('group_names')}); "
            "it starts fresh"
        )
    rng = backup / "rng.pt"
    if rng.is_file():
        _set_rng_state(torch.load(rng, map_location="cpu", weights_only=False))
    return read_progress(backup), state, warnings


def _rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
