"""A run that fails during training says so, and where its log is, on stderr — whatever stderr is connected to.

Real subprocesses of scripts/train.py with the output redirected to a file or to pipes, on the demo with a learning
rate that makes the loss infinite at step 2 (a failure during training, after the progress bar has started).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from onetrainer.cli.train import EXIT_FAILED
from tests.conftest import ROOT

FAILING = [
    "--preset", "demo", "--set", "learning_rate=1e30", "--set", "epochs=2", "--set", "sample_after_unit=NEVER",
    "--set", "cache_dir=cache", "--set", "output_model_destination=out.safetensors",
]  # fmt: skip


def _train(tmp_path: Path, workspace: str, to_file: bool, env: dict[str, str] | None = None) -> tuple[int, str]:
    command = [sys.executable, str(ROOT / "scripts" / "train.py"), *FAILING, "--set", f"workspace_dir={workspace}"]
    environment = {**os.environ, **(env or {})}
    if to_file:  # `train.py > out.txt 2>&1`
        with open(tmp_path / "out.txt", "wb") as out:
            run = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path, env=environment)
        code = run.returncode
        return code, (tmp_path / "out.txt").read_bytes().decode("utf-8", "replace")
    result = subprocess.run(command, capture_output=True, cwd=tmp_path, env=environment)  # `train.py 2>&1 | tee`
    return result.returncode, result.stderr.decode("utf-8", "replace")


@pytest.mark.slow
@pytest.mark.parametrize("to_file", [True, False], ids=["file", "pipe"])
def test_a_failed_run_ends_with_the_failure_and_the_log_path_on_redirected_stderr(tmp_path, to_file):
    code, output = _train(tmp_path, "workspace", to_file)
    assert code == EXIT_FAILED, output
    lines = [line for line in output.splitlines() if line.strip()]
    # The last two lines, each on a line of its own: the bar before them is closed (it ended its line).
    assert lines[-2].startswith("Training failed: the loss became NaN or infinite at step 2"), lines[-3:]
    log = Path("workspace") / "logs"
    assert lines[-1].startswith(f"The log with the full traceback: {log}"), lines[-3:]
    assert (tmp_path / lines[-1].split(": ", 1)[1]).is_file()


@pytest.mark.slow
def test_the_log_path_reaches_a_stderr_that_cannot_encode_it(tmp_path):
    """stderr in ASCII (a C locale without UTF-8, a Windows console code page) and a workspace with an umlaut: the
    path is printed escaped, not dropped."""
    code, output = _train(tmp_path, "wörkspace", to_file=False, env={"PYTHONIOENCODING": "ascii"})
    assert code == EXIT_FAILED, output
    lines = [line for line in output.splitlines() if line.strip()]
    assert lines[-2].startswith("Training failed: the loss became NaN or infinite"), lines[-3:]
    log = next(p for p in (tmp_path / "wörkspace" / "logs").glob("*.log") if "tensorboard" not in p.name)
    log = log.relative_to(tmp_path)
    assert lines[-1] == "The log with the full traceback: " + str(log).replace("ö", "\\xf6"), lines[-3:]


def test_the_app_started_from_a_terminal_shows_the_failure_and_the_log_path_last(in_tmp):
    """The app gives its terminal (or redirected stderr) a console sink, as train.py does: a failure ends there too
    with the failure and the log's path, not with a progress bar stuck mid-way."""
    import io

    from onetrainer.config import load_layers
    from onetrainer.training.console import ConsoleSink
    from onetrainer.training.control import TrainingControl
    from onetrainer.training.events import Failed
    from onetrainer.training.runner import run_training

    overrides = [FAILING[i + 1] for i, arg in enumerate(FAILING) if arg == "--set"] + ["workspace_dir=workspace"]
    config, _ = load_layers("demo", None, overrides)
    terminal = io.StringIO()
    outcome = run_training(config, TrainingControl(), [ConsoleSink(terminal)])  # what the app's runner runs
    assert isinstance(outcome, Failed)
    lines = [line for line in terminal.getvalue().splitlines() if line.strip()]
    assert lines[-2] == f"Training failed: {outcome.message}"
    assert lines[-1] == f"The log with the full traceback: {outcome.log_path}"
    assert "%|" in lines[-3]  # the closed bar, on a line of its own before them
