"""The remote half of a cloud run: `python -m onetrainer.remote.agent RUN_DIR`, started detached on the host.

RUN_DIR (`<cloud.remote_dir>/runs/<cloud.run_id>`) holds what the local side uploaded and reads back:

- `config.json`: the run's config, its paths already the host's (the local side wrote it, without any secret);
- `agent.pid`: this process (the local side asks whether it still runs);
- `events.jsonl`: every event of the run, one line of JSON each (`events.event_to_json`), appended as they happen;
  the local side tails it, from the start again after a reconnect;
- `control/`: a file per command the local side sends (`<n>-stop`, `<n>-sample`, `<n>-save`, `<n>-backup`), taken
  and deleted here at once; the trainer acts on it at its next step, as on the app's buttons;
- `outcome.json`: the run's last event, written when it ends (the run's log is `run.log`, this process's output);
- `on_end.json` (detached runs): the shell command `cloud.on_detached_finish` / `on_detached_error` asked for (RunPod:
  stop or delete the pod), run at the end unless the local side follows the run (its `follower` file touched within
  `FOLLOWER_SECONDS`): then the local side downloads first and acts with `on_finish` / `on_error`.

The process runs in a session of its own, its input /dev/null, so a dropped connection leaves it training; SIGTERM
and SIGHUP stop it as the Stop button does (a backup and the model are written).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import traceback
from pathlib import Path

from onetrainer.training.events import Event, Failed, event_to_json

COMMANDS = ("stop", "sample", "save", "backup")
POLL_SECONDS = 0.5
FOLLOWER_SECONDS = 60.0


class JsonLinesSink:
    """Appends each event to a file, one line of JSON, flushed at once (the local side reads it while it grows)."""

    def __init__(self, path: Path) -> None:
        self.file = path.open("a", encoding="utf-8")
        self.lock = threading.Lock()

    def emit(self, event: Event) -> None:
        with self.lock:
            self.file.write(event_to_json(event) + "\n")
            self.file.flush()

    def close(self) -> None:
        with self.lock:
            self.file.flush()


def _watch_commands(folder: Path, control, done: threading.Event) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    while not done.wait(POLL_SECONDS):
        for path in sorted(folder.iterdir()):
            command = path.name.rsplit("-", 1)[-1]
            with contextlib.suppress(OSError):
                path.unlink()
            if command == "stop":
                control.request_stop()
            elif command in COMMANDS:
                getattr(control, f"request_{command}")()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m onetrainer.remote.agent RUN_DIR", file=sys.stderr)
        return 2
    run_dir = Path(args[0])
    (run_dir / "agent.pid").write_text(str(os.getpid()), encoding="utf-8")
    sink = JsonLinesSink(run_dir / "events.jsonl")
    outcome: Event
    done = threading.Event()
    try:
        from onetrainer.cli import register_model_sources
        from onetrainer.config import config_from_dict
        from onetrainer.training.control import TrainingControl
        from onetrainer.training.devices import torch_threads, training_threads
        from onetrainer.training.runner import run_training

        register_model_sources()
        control = TrainingControl()
        for name in ("SIGTERM", "SIGHUP"):
            signal.signal(getattr(signal, name), lambda *_: control.request_stop())
        threading.Thread(
            target=_watch_commands, args=(run_dir / "control", control, done), name="onetrainer-remote-control"
        ).start()
        config, _ = config_from_dict(json.loads((run_dir / "config.json").read_text(encoding="utf-8")))
        with torch_threads(training_threads()):
            outcome = run_training(config, control, [sink])  # it emits the outcome itself
    except BaseException as e:  # the outcome must reach the local side whatever happened
        outcome = Failed(f"the remote trainer failed: {type(e).__name__}: {e}", traceback.format_exc())
        sink.emit(outcome)
    finally:
        done.set()
    tmp = run_dir / "outcome.json.tmp"
    tmp.write_text(event_to_json(outcome), encoding="utf-8")
    os.replace(tmp, run_dir / "outcome.json")
    sink.close()
    run_end_action(run_dir, failed=isinstance(outcome, Failed))
    return 0 if not isinstance(outcome, Failed) else 1


def run_end_action(run_dir: Path, failed: bool) -> str | None:
    """The detached run's end action (`on_end.json`), unless a follower is there to act after downloading; the
    command run, if any."""
    import subprocess
    import time

    try:
        actions = json.loads((run_dir / "on_end.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    command = actions.get("failed" if failed else "finished")
    follower = run_dir / "follower"
    if not command or (follower.exists() and time.time() - follower.stat().st_mtime < FOLLOWER_SECONDS):
        return None
    print(f"running the end action: {command}", flush=True)
    subprocess.run(command, shell=True, check=False)
    return command


if __name__ == "__main__":
    sys.exit(main())
