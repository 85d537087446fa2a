"""`scripts/job_queue.py`: the queue of training runs: add configs, list, reorder, remove, and run it headless."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from onetrainer.cli import register_model_sources
from onetrainer.cli.train import (
    EXIT_ABORTED,
    EXIT_FAILED,
    EXIT_INVALID,
    EXIT_OK,
    _end_progress,
    _HelpFormatter,
    _install_stop_signals,
    _main_thread,
    _say,
    check_config,
    queue_config,
)

DESCRIPTION = "A queue of training runs, run one after another without the GUI (the app's queue window shows the same)."
EPILOG = """\
Each entry keeps a copy of its config as it was added (concepts and samples
included): editing the file afterwards changes nothing queued; add it again.
Entries are named by their position in the list (1 is the first) or their id.
run trains the queued entries in order until none waits (entries added
meanwhile too); a failed run is recorded with its reason and the next starts.
Ctrl+C, SIGTERM and SIGHUP stop the current run after its step (backup, save),
as train.py does, and leave the rest queued; a second Ctrl+C aborts it.
An entry left running by a crash or a reboot is queued again.
Exit codes: 0 every run finished (or a stop was asked for), 1 a run failed or
the queue cannot be read, 2 invalid arguments or config, 130 aborted.
The queue: job-queue.json in ~/.config/onetrainer ($XDG_CONFIG_HOME, or
$ONETRAINER_STATE_DIR when set), or --queue-file."""


def build_parser(prog: str = "job_queue.py") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=DESCRIPTION, epilog=EPILOG, formatter_class=_HelpFormatter)
    parser.add_argument("--queue-file", metavar="FILE", help="another queue file than the app's")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    add = commands.add_parser(
        "add",
        help="check a config and queue a copy of it",
        formatter_class=_HelpFormatter,
        description="Check a config (as train.py --check does) and add a copy of it to the end of the queue.",
    )
    add.add_argument("config", metavar="CONFIG", help="a training config (JSON; sparse is fine)")
    add.add_argument("--preset", metavar="NAME_OR_FILE", help="a preset under the config (as train.py --preset)")
    add.add_argument(
        "--set", metavar="KEY=VALUE", action="append", default=[], dest="overrides", help="override one setting"
    )
    add.add_argument("--name", help="what the list calls the run (default: the file's and the output's names)")
    commands.add_parser("list", help="show the entries in order, with their status", formatter_class=_HelpFormatter)
    move = commands.add_parser("move", help="move an entry to another position", formatter_class=_HelpFormatter)
    move.add_argument("entry", metavar="ENTRY", help="its position or id")
    move.add_argument("position", metavar="POSITION", type=int, help="where it goes (1 is the first)")
    remove = commands.add_parser("remove", help="remove an entry", formatter_class=_HelpFormatter)
    remove.add_argument("entry", metavar="ENTRY", help="its position or id")
    requeue = commands.add_parser(
        "requeue", help="queue a finished, stopped or failed entry again", formatter_class=_HelpFormatter
    )
    requeue.add_argument("entry", metavar="ENTRY", help="its position or id")
    commands.add_parser("clear", help="remove the finished, stopped and failed entries", formatter_class=_HelpFormatter)
    commands.add_parser("run", help="train the queued entries one after another", formatter_class=_HelpFormatter)
    return parser


def main(argv: Sequence[str] | None = None, prog: str = "job_queue.py") -> int:
    from onetrainer.training.job_queue import JobQueue, QueueError

    parser = build_parser(prog)
    args = parser.parse_args(argv)
    register_model_sources()
    queue = JobQueue(args.queue_file)
    try:
        if args.command == "add":
            return _add(args)
        if args.command == "list":
            return _list(queue)
        if args.command == "move":
            entry = queue.move(args.entry, args.position)
            print(f"Moved {entry.name} ({entry.id}).")
            return _list(queue)
        if args.command == "remove":
            entry = queue.remove(args.entry)
            print(f"Removed {entry.name} ({entry.id}).")
            return EXIT_OK
        if args.command == "requeue":
            entry = queue.requeue(args.entry)
            print(f"Queued again: {entry.name} ({entry.id}).")
            return EXIT_OK
        if args.command == "clear":
            print(f"Removed {queue.clear_done()} finished, stopped or failed entries.")
            return EXIT_OK
        return _run(queue)
    except QueueError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_FAILED


def _add(args) -> int:
    from onetrainer.config import ConfigFileError, load_layers

    try:
        config, problems = load_layers(args.preset, args.config, args.overrides)
    except ConfigFileError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_INVALID
    if not check_config(config, problems):
        return EXIT_INVALID
    return queue_config(config, str(Path(args.config).absolute()), args.name or "", args.queue_file)


def _list(queue) -> int:
    entries = queue.entries()
    if not entries:
        print(f"The queue is empty ({queue.path}).")
        return EXIT_OK
    for position, entry in enumerate(entries, 1):
        print(entry.line(position))
    waiting = sum(1 for e in entries if e.status == "queued")
    print(f"{waiting} waiting; the queue: {queue.path}")
    return EXIT_OK


def _run(queue) -> int:
    from onetrainer.training.console import ABORTED, ConsoleSink, failure_lines
    from onetrainer.training.devices import torch_threads, training_threads
    from onetrainer.training.events import Failed
    from onetrainer.training.job_queue import FAILED, run_queue

    if not queue.waiting():
        print("No run waits in the queue.")
        return EXIT_OK
    restore: dict = {}
    consoles: list = []

    def new_control(entry):
        from onetrainer.training.control import TrainingControl

        control = TrainingControl()
        if _main_thread():  # each run its own stop: a Ctrl+C stops the run it arrives in
            restore.update({k: v for k, v in _install_stop_signals(control).items() if k not in restore})
        return control

    def sinks(entry):
        consoles[:] = [ConsoleSink()] if os.environ.get("RANK", "0") == "0" else []
        return list(consoles)

    def on_start(entry, left):
        _say(f"== Queue: {entry.name} ({entry.id}); {left} more waiting after it")

    def on_end(entry, outcome):
        _end_progress(consoles)
        if isinstance(outcome, Failed) and not consoles:
            for line in failure_lines(outcome):
                _say(line)
        _say(f"== Queue: {entry.name}: {entry.status}" + (f" ({entry.reason})" if entry.status != FAILED else ""))

    try:
        with torch_threads(training_threads()):
            result = run_queue(queue, new_control=new_control, sinks=sinks, on_start=on_start, on_end=on_end)
    except KeyboardInterrupt:
        _end_progress(consoles)
        _say(f"Training aborted: {ABORTED}. The entries left stay queued.")
        return EXIT_ABORTED
    finally:
        for signum, handler in restore.items():
            with contextlib.suppress(ValueError, OSError):
                signal.signal(signum, handler)
    left = len(queue.waiting())
    failed = result.failed
    summary = f"Queue: {len(result.done)} run(s), {len(failed)} failed; {left} waiting"
    if result.stopped:
        summary += " (stopped on request: run the queue again to go on)"
    _say(summary)
    for entry in failed:
        _say(f"  failed: {entry.name} ({entry.id}): {entry.reason.splitlines()[0] if entry.reason else ''}")
    return EXIT_FAILED if failed else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
