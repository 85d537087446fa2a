"""What a run writes while it trains and at its end: samples, backups, intermediate saves, the final model, and the
validation record that names each checkpoint's loss.

Rank 0 alone writes (`writes`); on the other ranks each of these does nothing, so the loop calls them on every rank.
A failed sample, backup or intermediate save is a warning and training goes on; a failed final save keeps the
trained state in a backup and says how to save it.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from onetrainer.sampling.sampler import failure_reason, looks_broken, render, save_sample
from onetrainer.training.checkpoint import run_identity, write_backup
from onetrainer.training.devices import release_cached_memory
from onetrainer.training.events import BestCheckpoint, SampleReady, Scalars, Status, Validated, Warning_
from onetrainer.training.validation import (
    LOSS_METADATA_KEY,
    STEP_METADATA_KEY,
    Checkpoint,
    ValidationRecord,
    ValidationResult,
    combine,
    progress_label,
)
from onetrainer.training.workspace import safe_name
from onetrainer.util.disk import is_write_error, write_error_message
from onetrainer.util.fs import atomic_write_json, remove_leftovers

if TYPE_CHECKING:
    import torch

    from onetrainer.config import TrainConfig
    from onetrainer.families.base import Family, LoadedModel
    from onetrainer.methods.base import Method
    from onetrainer.training.checkpoint import TrainProgress
    from onetrainer.training.events import Broadcast
    from onetrainer.training.optimization import Optimization
    from onetrainer.training.placement import Placement
    from onetrainer.training.sharding import ShardedParts
    from onetrainer.training.workspace import Workspace

log = logging.getLogger(__name__)


class SaveFailed(RuntimeError):
    """The final model could not be written; the message says where the trained state is kept."""


def prepare_workspace(
    config: TrainConfig, workspace: Workspace, as_given: dict | None, events: Broadcast, writes: bool
) -> None:
    """Before anything else (rank 0): remove the temporary files and folders of writes that a kill interrupted (ours
    carry the writer's process id), and keep the config as the user gave it in the workspace."""
    if not writes:
        return
    destination = Path(config.output_model_destination).expanduser()
    folders = [workspace.dir(sub) for sub in ("backup", "save", "config")] + [destination.parent]
    removed = [p for folder in folders for p in remove_leftovers(folder)]
    for sub in ("latents", "text"):
        removed += remove_leftovers(Path(config.cache_dir).expanduser() / sub, recursive=True)
    for path in removed:
        events.emit(Status(f"removed {path}, left over from an interrupted write"))
    atomic_write_json(workspace.config_path, as_given or config.to_dict())


class Outputs:
    def __init__(
        self,
        config: TrainConfig,
        workspace: Workspace,
        events: Broadcast,
        writes: bool,
        family: Family,
        model: LoadedModel,
        method: Method,
        device: torch.device,
        placement: Placement,
        optimization: Optimization,
        sharding: ShardedParts | None = None,
    ) -> None:
        self.config, self.workspace, self.events, self.writes = config, workspace, events, writes
        self.family, self.model, self.method, self.device = family, model, method, device
        self.placement, self.optimization = placement, optimization
        # SHARDED: every process takes part in gathering the weights for a save and in writing a backup's shards.
        self.sharding = sharding
        self.last_backup: Path | None = None
        self.backup_step = -1  # the step of the last backup written by this run (or resumed from)
        self.record: ValidationRecord | None = None  # with validation on
        self._record_failed = False

    # -- validation ---------------------------------------------------------------------------------------------------
    def open_record(self, resumed_at: int | None) -> None:
        """The workspace's `validation.json`; a run resumed at step `resumed_at` counts the earlier runs' entries up to
        that step as its own."""
        if not self.writes:
            return
        record, problem = ValidationRecord.open(self.workspace.root, self.workspace.run_name, run_identity(self.config))
        if problem:
            self._warn(problem)
        if resumed_at is not None:
            record.resumed(resumed_at)
        self.record = record

    def best(self) -> Checkpoint | None:
        return self.record.best() if self.record is not None else None

    def validated(self, measured: dict[int, tuple[str, list[float]]], p: TrainProgress) -> ValidationResult | None:
        """Report and record every rank's measurements (image index → concept, one loss per range); the result."""
        if not self.writes:
            return None
        if not measured:
            self._warn("no validation image could be read: nothing was validated")
            return None
        result = combine([measured[i] for i in sorted(measured)], p.global_step, p.epoch, p.epoch_step)
        self.events.emit(Scalars(p.global_step, result.scalars()))
        best = result
        if self.record is not None:
            self.record.add_validation(result)
            self._write_record()
            best = self.record.best_validation() or result
        label = progress_label(result.epoch, result.epoch_step, result.step)
        best_label = progress_label(best.epoch, best.epoch_step, best.step)
        self.events.emit(Validated(p.global_step, label, result.loss, result.ranges, best.loss, best_label))
        return result

    def _record_checkpoint(self, kind: str, path: Path, result: ValidationResult | None, p: TrainProgress) -> None:
        """Note a written checkpoint and its validation loss in the record; say so when it is the run's new best."""
        if result is None or self.record is None:
            return
        checkpoint = Checkpoint(kind, str(path), p.global_step, p.epoch, p.epoch_step, result.loss, result.step)
        best = self.record.add_checkpoint(checkpoint)
        if best is not None:
            self.events.emit(BestCheckpoint(best.path, best.label, best.loss))
        self._write_record()

    def _write_record(self) -> None:
        try:
            self.record.write()
        except OSError as e:
            if not self._record_failed:  # once: training goes on, the losses are still in TensorBoard and the log
                path = self.record.path
                self._warn(f"the validation record is not kept: {write_error_message(e, path)}; training goes on")
            self._record_failed = True

    def _use_validation(self, result: ValidationResult | None) -> None:
        """The header of the files saved next carries `result`'s loss and step."""
        metadata = {LOSS_METADATA_KEY: f"{result.loss:.6g}", STEP_METADATA_KEY: str(result.step)} if result else {}
        self.method.run_metadata = metadata

    # -- samples ------------------------------------------------------------------------------------------------------
    def report(self, text: str) -> None:
        """A status line of rank 0's (what every rank does, said once)."""
        if self.writes:
            self._status(text)

    def sample(self, p: TrainProgress) -> bool:
        """Render the enabled samples (the EMA's weights, and the trained ones too with `non_ema_sampling`); whether
        any was rendered (the parts are then in eval mode)."""
        # Sharded, every process renders every sample in step with the others (each block's forward gathers its shards
        # from all of them); rank 0 alone writes what it rendered.
        if not (self.writes or self.sharding is not None) or not any(s.enabled for s in (self.config.samples or [])):
            return False
        self.report("sampling")
        with self.resharded(), self.optimization.inference_weights(), self.placement.for_sampling():
            self._render_samples("", p)
        if self.optimization.ema is not None and self.config.non_ema_sampling:
            with self.resharded(), self.optimization.inference_weights(use_ema=False), self.placement.for_sampling():
                self._render_samples(" - no-ema", p)
        return True

    def resharded(self):
        """Around computing with the weights outside training (samples, validation): sharded, every part holds its
        shards alone before and after (`ShardedParts.resharded`)."""
        return self.sharding.resharded() if self.sharding is not None else contextlib.nullcontext()

    def _render_samples(self, suffix: str, p: TrainProgress) -> None:
        ext = self.config.sample_image_format.extension
        for index, sample in enumerate(self.config.samples or []):
            if not sample.enabled:
                continue
            folder = self.workspace.dir("samples") / f"{index} - {safe_name(sample.prompt)}{suffix}"
            name = f"{self.workspace.run_name}-training-sample-{p.global_step}-{p.epoch}-{p.epoch_step}{ext}"
            try:
                image = render(
                    self.family,
                    self.model,
                    sample,
                    self.method.embeddings.apply,
                    self.device,
                    self.config.rescale_noise_scheduler_to_zero_terminal_snr,
                )
                if not self.writes:
                    continue
                path = save_sample(
                    image, folder / name, self.config.sample_image_format.value, self.config.sample_video_format
                )
            except Exception as e:  # a preview is never worth the run
                log.exception("sample %d failed", index)  # the traceback goes to the run's log file
                if self.writes:
                    message = f"sample {index} ('{sample.prompt + suffix}') failed: {failure_reason(e)}"
                    self._warn(f"{message}; training goes on")
                release_cached_memory(self.device)
                continue
            broken = looks_broken(image)
            if broken:
                self._warn(f"{broken} ({path}): the usual fix is to {self.family.broken_sample_advice}")
            self.events.emit(SampleReady(p.global_step, index, sample.prompt + suffix, str(path)))

    # -- checkpoints --------------------------------------------------------------------------------------------------
    def backup(self, p: TrainProgress, validation: ValidationResult | None) -> Path | None:
        """Write a backup; a failure (a full disk) is a warning and training goes on. Sharded, every process writes its
        shards first (`sharding.write_state`), which rank 0 moves into the backup."""
        config, optimization = self.config, self.optimization
        sharded = None
        if self.sharding is not None:
            self.report("writing a backup")
            try:
                shards = self.sharding.write_state(
                    self.workspace.dir("backup"), optimization.optimizer, optimization.ema
                )
            except Exception as e:  # DCP raises on every process when one cannot write: they go on alike
                self._warn(f"the backup at step {p.global_step} failed: {failure_reason(e)}")
                return None
            sharded = (shards, self.sharding.dist.world_size)
        if not self.writes:
            return None
        if self.sharding is None:
            self._status("writing a backup")
        keep = config.rolling_backup_count if config.rolling_backup else None
        extra = {"ema": optimization.ema.state_dict()} if optimization.ema is not None else None
        folder = self.workspace.dir("backup")
        loss = {"loss": validation.loss, "step": validation.step} if validation is not None else None
        try:
            with self.placement.whole():
                path = write_backup(
                    folder,
                    self.method,
                    optimization.optimizer,
                    optimization.lr_scheduler,
                    p,
                    config,
                    extra,
                    keep,
                    loss,
                    config.keep_best,
                    sharded,
                )
        except Exception as e:
            if not is_write_error(e):
                raise
            self._warn(f"the backup at step {p.global_step} failed: {write_error_message(e, folder)}")
            return None
        self.last_backup, self.backup_step = path, p.global_step
        self._status(f"backup written: {path}")
        self._record_checkpoint("backup", path, validation, p)
        return path

    def save(self, p: TrainProgress, validation: ValidationResult | None) -> None:
        """An intermediate save into the workspace's `save` folder; a failure is a warning and training goes on.
        Sharded, every process takes part in gathering the weights, which rank 0 writes."""
        states = None
        if self.sharding is not None:
            with self.optimization.inference_weights():  # every process gathers the weights saved (the EMA's)
                states = self.sharding.full_state()
        if not self.writes:
            return
        fmt = self.config.output_model_format
        suffix = "" if fmt.is_directory else ".safetensors"
        name = f"{self.config.save_filename_prefix}{self.workspace.run_name}-save-{p.suffix()}{suffix}"
        path = self.workspace.dir("save") / name
        self._use_validation(validation)
        try:
            weights = self.optimization.inference_weights() if states is None else contextlib.nullcontext()
            with weights, self.placement.whole(), self._plain(states):
                self.method.save_output(path)
        except Exception as e:
            if not is_write_error(e):
                raise
            self._warn(f"the intermediate save failed: {write_error_message(e, path)}; training goes on")
            return
        self._status(f"saved {name}")
        self._record_checkpoint("save", path, validation, p)

    def save_final(
        self, p: TrainProgress, validation: ValidationResult | None, backup: Callable[[], Path | None]
    ) -> Path:
        """Write the model. When that fails, the trained state is kept in a backup (`backup`, unless the last one is of
        this step) and the message says how to save it (resume saves a model that is missing or older than the last
        backup)."""
        if self.sharding is not None:
            return self._save_final_sharded(p, validation, backup)
        if not self.writes:
            return Path(self.config.output_model_destination).expanduser()
        self._status("saving the model")
        destination = self._final_destination()
        self._use_validation(validation)
        if self.optimization.ema is not None:
            self.optimization.ema.copy_to_params()  # the final model takes the averaged weights
        try:
            with self.optimization.inference_weights(use_ema=False), self.placement.whole():
                written = self.method.save_output(destination)
        except Exception as e:
            if not is_write_error(e):
                raise
            if self.backup_step != p.global_step:
                backup()  # the trained state must survive a failed save (a bad output path, a full disk)
            raise SaveFailed(self._save_failed_message(write_error_message(e, destination), p)) from e
        # where the model is not the destination itself, the files written (a LoRA file per expert: Wan 2.2)
        shown = destination if destination.exists() or not written else ", ".join(str(path) for path in written)
        self._status(f"model saved: {shown}")
        self._record_checkpoint("final", destination, validation, p)
        return destination

    def _save_final_sharded(
        self, p: TrainProgress, validation: ValidationResult | None, backup: Callable[[], Path | None]
    ) -> Path:
        """`save_final` of a sharded run: every process gathers the weights, rank 0 writes them (atomically, as
        always); whether that worked is agreed, so that after a failed write every process writes the backup."""
        destination = Path(self.config.output_model_destination).expanduser()
        failure, error = None, None
        if self.optimization.ema is not None:
            self.optimization.ema.copy_to_params()  # the final model takes the averaged weights (each its shard)
        states = self.sharding.full_state()  # every process gathers; a failed or killed one fails it everywhere
        if self.writes:
            self._status("saving the model")
            destination = self._final_destination()
            self._use_validation(validation)
            try:
                with self.placement.whole(), self.sharding.plain_parts(states):
                    self.method.save_output(destination)
            except Exception as e:
                error = e
                reason = write_error_message(e, destination) if is_write_error(e) else failure_reason(e)
                failure = (reason, is_write_error(e))
        del states
        failure = self.sharding.agree(failure)  # the others learn how rank 0's write went, and go on alike
        if failure is not None:
            reason, disk = failure
            if not disk:  # not the disk: rank 0's own error ends the run, the others end with its words
                if error is not None:
                    raise error
                raise RuntimeError(f"rank 0 could not save the model: {reason}")
            if self.backup_step != p.global_step:
                backup()  # the trained state must survive a failed save (a bad output path, a full disk)
            raise SaveFailed(self._save_failed_message(reason, p)) from error
        if self.writes:
            self._status(f"model saved: {destination}")
            self._record_checkpoint("final", destination, validation, p)
        return destination

    def _plain(self, states: dict | None):
        """Rank 0's model with the gathered full weights of the sharded parts for the duration (nothing when not
        sharded)."""
        return self.sharding.plain_parts(states) if self.sharding is not None else contextlib.nullcontext()

    def _final_destination(self) -> Path:
        """The output path; with 'Prevent overwrites', a file that appeared during training (another run's) is kept
        and the model gets a name of its own beside it."""
        destination = Path(self.config.output_model_destination).expanduser()
        if not (self.config.prevent_overwrites and destination.exists()):
            return destination
        suffix = "" if self.config.output_model_format.is_directory else destination.suffix
        stem = destination.name[: len(destination.name) - len(suffix)] if suffix else destination.name
        alternative = destination.with_name(f"{stem}-{self.workspace.run_name}{suffix}")
        self._warn(
            f"{destination} appeared during training and 'Prevent overwrites' is on: it is kept, and this run's model "
            f"is saved as {alternative}"
        )
        return alternative

    def _save_failed_message(self, reason: str, p: TrainProgress) -> str:
        if self.backup_step == p.global_step and self.last_backup is not None:
            return (
                f"the model could not be saved: {reason}. The trained state is in the backup {self.last_backup}: fix "
                "the output location (or free space) and run again with 'Continue from last backup' to save it"
            )
        return f"the model could not be saved, nor a backup written: {reason}"

    def _status(self, text: str) -> None:
        self.events.emit(Status(text))

    def _warn(self, text: str) -> None:
        self.events.emit(Warning_(text))
