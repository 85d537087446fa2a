"""The one entry point that runs a training config, for the CLI and the GUI's background thread alike."""

from __future__ import annotations

import logging
import traceback
from typing import TYPE_CHECKING

from onetrainer.config import TrainConfig
from onetrainer.config.io import pack
from onetrainer.config.naming import describe
from onetrainer.config.schema import errors
from onetrainer.training import console
from onetrainer.training.checks import run_checks
from onetrainer.training.control import TrainingControl
from onetrainer.training.events import Broadcast, EventSink, Failed, Finished, Warning_
from onetrainer.util.disk import is_write_error, write_error_message

if TYPE_CHECKING:
    from onetrainer.training.distributed import Distributed

log = logging.getLogger(__name__)

# The text of a second Ctrl+C's outcome, which the console shows as an abort (not a failure).
ABORTED = console.ABORTED


def run_training(
    config: TrainConfig, control: TrainingControl, sinks: list[EventSink], checked: bool = False
) -> Finished | Failed:
    """Train `config` to the end (or until `control` asks to stop). Never raises: the outcome is an event.

    The config is used as given (pass a copy when the caller keeps editing its own). `checked` skips the run checks
    when the caller has just made them.
    """
    events = Broadcast(sinks)
    if not checked:
        problems = run_checks(config)
        for problem in problems:
            if not problem.is_error:
                events.emit(Warning_(describe(problem, config, severity=False)))
        if errors(problems):
            outcome = Failed(
                "The config cannot be trained:\n" + "\n".join(describe(p, config) for p in errors(problems)),
                refused=True,
            )
            events.emit(outcome)
            events.close()
            return outcome
    if isinstance(config.cloud, dict) and config.cloud.get("enabled"):  # trains on the cloud block's host
        from onetrainer.remote.run import run_remote

        return run_remote(config, control, events.sinks)
    config, problems = pack(config)
    from onetrainer.families.sources import SourceFailed, prepare_config

    as_given = config.to_dict()  # what the run's workspace records: `tiny:sd15`, not the folder it stands for
    try:
        # The packed copy: names a registered source stands for become the local folders and files it builds, so the
        # families, the data and every rank see local paths only. The checks have shown its notice (the overrides
        # the source's base model does without).
        prepare_config(config)
    except SourceFailed as e:  # a name its source does not know (the checks say so, unless skipped), a failed build
        outcome = Failed(str(e), traceback.format_exc())
        events.emit(outcome)
        events.close()
        return outcome
    from onetrainer.training.launcher import launch_wanted, run_ranks

    if launch_wanted(config):  # the app's Start (or train.py) with multi_gpu: this process is rank 0 of several
        outcome = run_ranks(config, events, lambda dist: _train(config, control, events, dist, as_given))
    else:
        outcome = _train(config, control, events, as_given=as_given)
    events.emit(outcome)
    events.close()
    return outcome


def _train(
    config: TrainConfig,
    control: TrainingControl,
    events: Broadcast,
    dist: Distributed | None = None,
    as_given: dict | None = None,
) -> Finished | Failed:
    """One process's run; `dist` is the group the launcher joined, else torchrun's (or none) is joined here."""
    from onetrainer.training.distributed import Distributed
    from onetrainer.training.processes import rank_devices
    from onetrainer.training.workspace import WorkspaceBusy, WorkspaceLock
    from onetrainer.util.quiet import quiet_libraries

    quiet_libraries()
    if dist is None:
        try:
            dist = Distributed.from_environment(rank_devices(config))
        except Exception as e:  # a bad rendezvous, device_indexes that name no GPU
            message = f"cannot join the other training processes: {type(e).__name__}: {e}"
            return Failed(message, traceback.format_exc())
    lock = None
    refusal = ""
    if dist is None or dist.is_main:  # one lock per run: rank 0 writes the run's outputs
        try:
            lock = WorkspaceLock.acquire(config.workspace_dir)
        except WorkspaceBusy as e:
            refusal = str(e)
        except OSError as e:
            refusal = f"cannot create the workspace {config.workspace_dir}: {write_error_message(e)}"
    if dist is not None:  # every rank stops when rank 0 cannot have the workspace
        refusal = dist.broadcast_object(refusal)
    if refusal:
        if dist is not None:
            dist.close()
        return Failed(refusal, refused=True)
    if lock is not None and lock.taken_over is not None:
        dead = lock.taken_over.describe()
        events.emit(Warning_(f"the workspace's lock was left by a run that is no longer running ({dead}): taken over"))
    try:
        return _train_locked(config, control, events, dist, as_given)
    finally:
        if lock is not None:
            lock.release()


def _train_locked(
    config: TrainConfig,
    control: TrainingControl,
    events: Broadcast,
    dist: Distributed | None,
    as_given: dict | None = None,
) -> Finished | Failed:
    from onetrainer.training.trainer import Trainer
    from onetrainer.training.workspace import LogFileSink, Workspace

    workspace = None
    try:
        workspace = Workspace.create(config.workspace_dir, config.save_filename_prefix)
        if dist is not None:  # one run name for all ranks; rank 0's log is the run's, the others' carry their rank
            workspace = Workspace(workspace.root, dist.broadcast_object(workspace.run_name))
        log_path = workspace.log_path
        if dist is not None and not dist.is_main:
            log_path = log_path.with_name(f"{workspace.run_name}-rank{dist.rank}.log")
        log_sink = LogFileSink(log_path)
    except OSError as e:
        where = workspace.log_path if workspace is not None else config.workspace_dir
        return Failed(f"cannot create the workspace {config.workspace_dir}: {write_error_message(e, where)}")
    events.sinks.insert(0, log_sink)
    trainer = Trainer(config, control, events, workspace, dist, as_given)
    outcome = None
    try:
        outcome = trainer.run()
        return outcome
    except KeyboardInterrupt:  # a second Ctrl+C: end now, with one line in the log instead of a traceback
        return Failed(ABORTED, "", str(log_path))
    except Exception as e:
        if control.abort_requested:
            # The interrupt can surface wrapped in another error (e.g. diffusers' lazy imports turn it into a
            # RuntimeError): the user asked to abort, so it is an abort, not a failure.
            log.debug("aborted", exc_info=True)
            return Failed(ABORTED, "", str(log_path))
        log.debug("training failed", exc_info=True)
        return Failed(_user_message(e), traceback.format_exc(), str(log_path))
    finally:
        trainer.stop_tensorboard()
        if dist is not None:
            dist.close(finished=isinstance(outcome, Finished))


def _user_message(error: Exception) -> str:
    from onetrainer.data.training_data import DatasetError
    from onetrainer.families.loading import ModelLoadError
    from onetrainer.families.sources import ModelNotFound
    from onetrainer.training.distributed import RankFailed
    from onetrainer.training.outputs import SaveFailed
    from onetrainer.training.trainer import NonFiniteLoss

    if isinstance(error, ModelLoadError | ModelNotFound | DatasetError | NonFiniteLoss | SaveFailed | RankFailed):
        return str(error)
    if isinstance(error, NotImplementedError):
        return str(error)
    if is_write_error(error):  # a full disk, a folder that cannot be written (the cache, the config copy)
        return write_error_message(error)
    if isinstance(error, MemoryError) or "out of memory" in str(error).lower():
        return (
            "out of memory: lower the batch size or the resolution, use FLOAT_16 / BFLOAT_16 weights, turn on "
            f"gradient checkpointing, or use an 8-bit optimizer ({error})"
        )
    return f"{type(error).__name__}: {error}"
