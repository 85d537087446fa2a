"""'Continue from last backup': the run goes on from the newest intact backup of its own config, exactly where it
stopped (the weights, the optimizer's and the LR schedule's state, the progress and the random state)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from onetrainer.training.checkpoint import (
    BackupDamaged,
    TrainProgress,
    backup_settings,
    differing_settings,
    list_backups,
    read_meta,
    restore_backup,
    run_identity,
)

if TYPE_CHECKING:
    from onetrainer.config import TrainConfig
    from onetrainer.methods.base import Method
    from onetrainer.training.optimization import Optimization
    from onetrainer.training.placement import Placement
    from onetrainer.training.sharding import ShardedParts


def resume(
    config: TrainConfig,
    folder: Path,
    method: Method,
    optimization: Optimization,
    placement: Placement,
    warn: Callable[[str], None],
    sharding: ShardedParts | None = None,
) -> tuple[Path, TrainProgress] | None:
    """Restore the newest intact backup of this run's identity in `folder` (other configs' backups are not looked at;
    a damaged one is named and the next older one is tried): the backup and the progress it continues from, or None
    to start fresh."""
    backups = list_backups(folder, run_identity(config))
    if not backups:
        others = len(list_backups(folder))
        also = f" ({others} there are of other model types, methods, base models or concepts)" if others else ""
        warn(f"'Continue from last backup' is on but {folder} has no backup of this config{also}: starting fresh")
        return None
    for backup in reversed(backups):
        try:
            with placement.whole(written=True):
                progress, state, warnings = restore_backup(
                    backup, method, optimization.optimizer, optimization.lr_scheduler, sharding, optimization.ema
                )
        except BackupDamaged as e:
            warn(f"backup {backup.name} is damaged and skipped: {e}")
            continue
        break
    else:
        warn(f"no intact backup of this config in {folder}: starting fresh")
        return None
    if optimization.ema is not None and "ema" in state:
        optimization.ema.load_state_dict(state["ema"])
    for warning in warnings:
        warn(warning)
    _warn_changed_settings(config, backup, warn)
    return backup, progress


def _warn_changed_settings(config: TrainConfig, backup: Path, warn: Callable[[str], None]) -> None:
    changed = differing_settings(backup_settings(backup), config.to_dict())
    if not changed:
        return
    shown = "; ".join(f"{path}: {old!r} in the backup, {new!r} now" for path, old, new in changed[:8])
    more = f" and {len(changed) - 8} more" if len(changed) > 8 else ""
    warn(
        f"the config differs from the one {backup.name} was written with ({shown}{more}). The config's values "
        "are used (learning rates included); the backup brings the trained weights, the optimizer's state, the "
        "progress and the random state"
    )


def output_behind_backup(config: TrainConfig, resumed_from: Path | None) -> bool:
    """True when the resumed backup is complete but the output is missing or older: a run that trained to the
    end but whose final save never happened (killed, disk full, a bad output path)."""
    if resumed_from is None:
        return False
    destination = Path(config.output_model_destination).expanduser()
    if not destination.exists():
        return True
    written = read_meta(resumed_from).get("written_at", resumed_from.stat().st_mtime)
    return destination.stat().st_mtime < written
