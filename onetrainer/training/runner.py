"""The one entry point that runs a training config, for the CLI and the GUI's background thread alike."""

from __future__ import annotations

import logging
import traceback

from onetrainer.config import TrainConfig
from onetrainer.config.checks import run_checks
from onetrainer.config.io import pack
from onetrainer.config.naming import describe
from onetrainer.config.schema import errors
from onetrainer.training.control import TrainingControl
from onetrainer.training.events import Broadcast, EventSink, Failed, Finished, Warning_

log = logging.getLogger(__name__)


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
                "The config cannot be trained:\n" + "\n".join(describe(p, config) for p in errors(problems))
            )
            events.emit(outcome)
            events.close()
            return outcome
    config, problems = pack(config)
    outcome = _train(config, control, events)
    events.emit(outcome)
    events.close()
    return outcome


def _train(config: TrainConfig, control: TrainingControl, events: Broadcast) -> Finished | Failed:
    from onetrainer.training.trainer import Trainer
    from onetrainer.training.workspace import LogFileSink, Workspace
    from onetrainer.util.quiet import quiet_libraries

    quiet_libraries()
    try:
        workspace = Workspace.create(config.workspace_dir, config.save_filename_prefix)
    except OSError as e:
        return Failed(f"cannot create the workspace {config.workspace_dir}: {e.strerror or e}")
    log_sink = LogFileSink(workspace.log_path)
    events.sinks.insert(0, log_sink)
    trainer = Trainer(config, control, events, workspace)
    try:
        return trainer.run()
    except Exception as e:
        log.debug("training failed", exc_info=True)
        return Failed(_user_message(e), traceback.format_exc(), str(workspace.log_path))
    finally:
        trainer.stop_tensorboard()


def _user_message(error: Exception) -> str:
    from onetrainer.data.training_data import DatasetError
    from onetrainer.families.loading import ModelLoadError
    from onetrainer.families.sources import ModelNotFound
    from onetrainer.training.trainer import NonFiniteLoss

    if isinstance(error, ModelLoadError | ModelNotFound | DatasetError | NonFiniteLoss | NotImplementedError):
        return str(error)
    if isinstance(error, MemoryError) or "out of memory" in str(error).lower():
        return (
            "out of memory: lower the batch size or the resolution, use FLOAT_16 / BFLOAT_16 weights, turn on "
            f"gradient checkpointing, or use an 8-bit optimizer ({error})"
        )
    return f"{type(error).__name__}: {error}"
