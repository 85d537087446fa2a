"""The one entry point that runs a training config, for the CLI and the GUI's background thread alike."""

from __future__ import annotations

import traceback

from onetrainer.config import TrainConfig
from onetrainer.config.checks import run_checks
from onetrainer.config.schema import errors
from onetrainer.training.control import TrainingControl
from onetrainer.training.events import Broadcast, EventSink, Failed, Finished, Status, Warning_


def run_training(config: TrainConfig, control: TrainingControl, sinks: list[EventSink]) -> Finished | Failed:
    """Train `config` to the end (or until `control` asks to stop). Never raises: the outcome is an event.

    The config is used as given; pass a copy when the caller keeps editing its own.
    """
    events = Broadcast(sinks)
    try:
        problems = run_checks(config)
        for problem in problems:
            if not problem.is_error:
                events.emit(Warning_(str(problem)))
        if errors(problems):
            outcome: Finished | Failed = Failed(
                "The config cannot be trained:\n" + "\n".join(str(p) for p in errors(problems))
            )
        else:
            from onetrainer.families import load_family_class

            load_family_class(config.model_type)  # raises with a clear message until the family exists
            events.emit(Status("starting"))
            outcome = Failed("the training engine is not available yet")
    except NotImplementedError as e:
        outcome = Failed(str(e))
    except Exception as e:
        outcome = Failed(f"{type(e).__name__}: {e}", traceback.format_exc())
    events.emit(outcome)
    events.close()
    return outcome
