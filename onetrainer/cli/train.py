"""`scripts/train.py`: train a config headless, exactly as the app's Start button does."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from onetrainer.cli import register_model_sources
from onetrainer.config import ConfigFileError, errors, load_layers
from onetrainer.config.naming import describe
from onetrainer.training.checks import run_checks

if TYPE_CHECKING:
    from onetrainer.config import TrainConfig

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_INVALID = 2
EXIT_ABORTED = 130  # a second Ctrl+C, as shells report an interrupted command

DESCRIPTION = "Train a diffusion model (LoRA, fine-tune or embedding) from a config, without the GUI."
EPILOG = """\
Layers: defaults <- preset <- config file <- each --set, in that order.
A preset NAME is its path under presets/ without .json (e.g. sd15/lora, demo).
--set keys are dotted, with list indexes (concepts.0.path=/data/cats); values are
parsed as JSON when they parse (3, 1e-4, true, null, [1,2]), else taken as text.
Exit codes: 0 finished (also after a requested stop; a fit printed without
--train), 1 training failed (or another run trains in the same workspace_dir),
2 invalid config (every problem is listed) or a budget no change reaches, 130
aborted by a second Ctrl+C.
Ctrl+C, SIGTERM and SIGHUP stop after the current step: backup, save, exit 0.
Outputs: the model at output_model_destination; logs, samples, TensorBoard
files, backups and saves under workspace_dir."""


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    # A fixed width, so `-h` prints the same text everywhere (the README quotes it).
    def __init__(self, prog: str, **kwargs) -> None:
        kwargs.update(width=88, max_help_position=30)
        super().__init__(prog, **kwargs)


def build_parser(prog: str = "train.py") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=_HelpFormatter,
    )
    parser.add_argument("--config-path", metavar="FILE", help="a training config (JSON; sparse is fine)")
    parser.add_argument("--preset", metavar="NAME_OR_FILE", help="a preset name or a preset file")
    parser.add_argument(
        "--set",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        dest="overrides",
        help="override one setting (repeatable)",
    )
    parser.add_argument(
        "--keep-best",
        action="append_const",
        const="keep_best=true",
        dest="overrides",
        help="keep the backup with the lowest validation loss when rolling backups would delete it (the same as --set "
        "keep_best=true)",
    )
    parser.add_argument("--check", action="store_true", help="validate the config and the files it names, then exit")
    parser.add_argument(
        "--preflight", action="store_true", help="report the images, buckets, steps and cache, then exit"
    )
    parser.add_argument(
        "--fit-vram",
        type=float,
        metavar="GB",
        help="change what it takes (8-bit optimizer and weights, checkpointing, layer offloading, batch size) for the "
        "estimate to fit GB of GPU memory (GiB), print each change and exit (with --check or --preflight, check the "
        "changed config; with --train, train it)",
    )
    parser.add_argument(
        "--fit-ram",
        type=float,
        metavar="GB",
        help="the host RAM (GiB) the fit must stay within, beside --fit-vram or alone (a sharded run's processes "
        "together): a change that needs more (layer offloading keeps the blocks in RAM) is left out, and a run the "
        "host cannot hold is refused",
    )
    parser.add_argument(
        "--train",
        action="store_true",
        help="train after --fit-vram / --fit-ram changed the config (without it they print the changes and exit)",
    )
    parser.add_argument(
        "--queue",
        action="store_true",
        help="check the config, then add it to the queue of runs instead of training now (scripts/job_queue.py "
        "lists and runs the queue; with --fit-vram / --fit-ram, the changed config)",
    )
    return parser


def _packed(config: TrainConfig):
    from onetrainer.config.io import pack

    return pack(config)[0]


def main(argv: Sequence[str] | None = None, prog: str = "train.py") -> int:
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    register_model_sources()
    if not args.config_path and not args.preset:
        parser.print_usage(sys.stderr)
        print(f"{prog}: error: give --config-path, --preset, or both", file=sys.stderr)
        return EXIT_INVALID

    try:
        config, problems = load_layers(args.preset, args.config_path, args.overrides)
    except ConfigFileError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_INVALID
    fitting = args.fit_vram is not None or args.fit_ram is not None
    if args.train and (args.check or args.preflight):
        print(f"{prog}: error: --train trains; --check and --preflight check and exit: give one", file=sys.stderr)
        return EXIT_INVALID
    if args.queue and (args.check or args.preflight or args.train):
        print(
            f"{prog}: error: --queue queues the run instead of training or checking it: give it alone", file=sys.stderr
        )
        return EXIT_INVALID
    if fitting:
        fitted = _fit(config, args.fit_vram, args.fit_ram)
        if fitted is not None:
            return fitted
        if not (args.check or args.preflight or args.train or args.queue):
            print("Not trained: add --train to train it so, or --check / --preflight to check it.")
            return EXIT_OK
    if not check_config(config, problems):
        return EXIT_INVALID
    if args.check:
        print("The config is valid.")
        return EXIT_OK
    if args.preflight:
        return _preflight(config)
    if args.queue:
        return queue_config(config, str(Path(args.config_path).absolute()) if args.config_path else args.preset)
    code = _train(config)
    from onetrainer.training.distributed import end_worker_process, world_size_from_environment

    if world_size_from_environment() > 1:  # one rank of torchrun's run: ended without the interpreter's teardown
        end_worker_process(code)
    return code


def check_config(config: TrainConfig, problems: list) -> bool:
    """Run the checks (beside the problems loading found) and print each problem on stderr; False when any is an
    error (then the config cannot be trained)."""
    problems = problems + run_checks(config, include_schema=False)
    # Problems name the concept or sample (from the side files too) and the field, then the path --set takes.
    named = _packed(config) if problems else config
    for problem in problems:
        if not problem.is_error:
            print(describe(problem, named, with_path=True), file=sys.stderr)
    if errors(problems):
        count = len(errors(problems))
        print(f"The config is invalid ({count} problem{'s' if count > 1 else ''}):", file=sys.stderr)
        for problem in errors(problems):
            print(f"  {describe(problem, named, with_path=True)}", file=sys.stderr)
        return False
    return True


def queue_config(config: TrainConfig, source: str, name: str = "", queue_file: str | None = None) -> int:
    """Add a checked config to the queue of runs (`scripts/job_queue.py` runs it), a copy as it is now."""
    from onetrainer.training.job_queue import JobQueue, QueueError, relative_paths

    queue = JobQueue(queue_file)
    try:
        entry = queue.add(config, name=name, source=source)
        position = len(queue.entries())
    except QueueError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_FAILED
    print(f"Queued as entry {position} ({entry.id}): {entry.name}")
    relative = relative_paths(config)
    if relative:
        one = len(relative) == 1
        print(
            f"Note: {', '.join(relative)} {'is' if one else 'are'} relative: the queue's runner resolves "
            f"{'it' if one else 'them'} in the folder it runs from (this one: {os.getcwd()})."
        )
    print(f"The queue: {queue.path}; run it with scripts/job_queue.py run")
    return EXIT_OK


def _fit(config: TrainConfig, vram: float | None, ram: float | None) -> int | None:
    """Apply the changes that fit the estimate into `vram` GiB of GPU memory and `ram` GiB of host RAM (printed); an
    exit code when it cannot."""
    from onetrainer.training.estimate import device_throughput, training_device_type
    from onetrainer.training.fit import GIB, apply, fit_to_budget, machine_gpus

    asked = {"--fit-vram": vram, "--fit-ram": ram}
    for flag, gib in asked.items():
        if gib is not None and gib <= 0:
            print(f"error: {flag} must be a size in GiB above 0, not {gib:g}", file=sys.stderr)
            return EXIT_INVALID
    try:
        fit = fit_to_budget(
            _packed(config),
            vram * GIB if vram is not None else None,
            device_throughput(config.train_device),
            ram_budget_bytes=ram * GIB if ram is not None else None,
            gpus=machine_gpus(config.train_device),
        )
    except ValueError as e:
        print(f"error: cannot estimate this config to fit it: {e}", file=sys.stderr)
        return EXIT_INVALID
    flags = " ".join(f"{flag} {gib:g}" for flag, gib in asked.items() if gib is not None)
    print(f"{flags}: {fit.text()}")
    if training_device_type(config.train_device) != "cuda":
        print("  (sized for a CUDA GPU: this machine has none, and would train on the CPU)")
    if not fit.fits:
        return EXIT_INVALID
    if fit.changes:
        print("  the same as: " + " ".join(f"--set {c.path}={_set_text(c.json_value)}" for c in fit.changes))
    apply(config, fit.changes)
    return None


def _set_text(value) -> str:
    """A value as `--set` reads it back (JSON where it parses, else the text)."""
    import json

    return value if isinstance(value, str) else json.dumps(value)


def _preflight(config: TrainConfig) -> int:
    from onetrainer.config.io import pack
    from onetrainer.data.preflight import preflight_report
    from onetrainer.training.processes import preflight_text

    packed, _ = pack(config)
    report = preflight_report(packed)
    print(report.text())
    print(preflight_text(packed))
    print(_estimate_text(packed))
    return EXIT_INVALID if report.errors else EXIT_OK


def _estimate_text(config: TrainConfig) -> str:
    """Peak VRAM and time per step (`training/estimate.py`), against the training device's free memory."""
    from onetrainer.training.estimate import device_throughput, estimate, free_memory

    try:
        result = estimate(config, free_memory(config.train_device), device_throughput(config.train_device))
    except ValueError as e:
        return f"estimate: {e}"
    return "estimate: " + result.text()


def _train(config: TrainConfig) -> int:
    from onetrainer.training.console import ConsoleSink, failure_lines
    from onetrainer.training.control import TrainingControl
    from onetrainer.training.devices import torch_threads, training_threads
    from onetrainer.training.events import Failed
    from onetrainer.training.runner import ABORTED, run_training

    control = TrainingControl()
    previous = _install_stop_signals(control) if _main_thread() else {}
    # Under torchrun every process runs this; rank 0 alone shows progress (the others' logs are files).
    sinks = [ConsoleSink()] if os.environ.get("RANK", "0") == "0" else []
    try:
        with torch_threads(training_threads()):  # as the app trains
            outcome = run_training(config, control, sinks, checked=True)
    except KeyboardInterrupt:  # the second Ctrl+C arrived outside the run (after its last event)
        _end_progress(sinks)
        _say(f"Training aborted: {ABORTED}")
        return EXIT_ABORTED
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    _end_progress(sinks)
    if isinstance(outcome, Failed):
        if not sinks:  # the console sink has shown the failure and the log's path as the last lines
            for line in failure_lines(outcome):
                _say(line)
        return EXIT_ABORTED if outcome.message == ABORTED else EXIT_FAILED
    return EXIT_OK


def _end_progress(sinks: list) -> None:
    """Close the console's progress bar (its line ends) and flush stdout, so the last lines on the terminal, or in a
    file the output is redirected to, are the outcome and the log's path, never a bar stuck mid-way."""
    for sink in sinks:
        with contextlib.suppress(Exception):
            sink.close()
    with contextlib.suppress(OSError, ValueError):
        sys.stdout.flush()


def _install_stop_signals(control) -> dict:
    """Ctrl+C, SIGTERM (docker stop, systemd) and SIGHUP (a closed terminal or SSH session) stop like the app's Stop
    button: the current step ends, a backup and the model are written, the exit code is 0. A second Ctrl+C aborts."""

    def on_signal(signum, frame):
        name = signal.Signals(signum).name
        if control.stop_requested:
            if signum == signal.SIGINT:
                control.request_abort()
                raise KeyboardInterrupt
            _say(f"{name}: already stopping (the model is being saved); Ctrl+C aborts without saving")
            return
        again = "; press Ctrl+C again to abort" if signum == signal.SIGINT else ""
        _say(f"\n{name}: stopping after this step (a backup and the model are written){again}.")
        control.request_stop()

    previous = {}
    for name in ("SIGINT", "SIGTERM", "SIGHUP"):
        signum = getattr(signal, name, None)
        if signum is not None:  # SIGHUP does not exist on Windows
            previous[signum] = signal.signal(signum, on_signal)
    return previous


def _say(text: str) -> None:
    """A line on stderr; after SIGHUP the terminal may be gone, and that must not end the run."""
    from onetrainer.training.console import write_line

    with contextlib.suppress(OSError, ValueError):
        write_line(sys.stderr, text)


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


if __name__ == "__main__":
    sys.exit(main())
