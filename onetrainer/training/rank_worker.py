"""`python -m onetrainer.training.rank_worker --config-path FILE`: one of the other ranks of the app's multi-GPU run
(`launcher.py` starts it with torchrun's environment: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT).

It trains the packed config silently (rank 0 shows everything; this rank's log file is `<run>-rank<N>.log`), says
why in one last line when it fails, and ends as soon as its standard input closes: the process that started it has
ended, in any way (even killed), so no rank outlives the app.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

PARENT_GONE = 3  # the exit code when the starting process went away


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rank_worker", description=__doc__.splitlines()[0])
    parser.add_argument("--config-path", required=True, help="the packed config rank 0 wrote")
    parser.add_argument("--ready-path", help="a file to create once ready to join the group (rank 0 waits for it)")
    args = parser.parse_args(argv)
    from onetrainer.training.tensorboard_child import exit_when_parent_ends

    threading.Thread(target=exit_when_parent_ends, args=(PARENT_GONE,), name="parent-watch", daemon=True).start()

    from onetrainer.config import config_from_dict
    from onetrainer.training.control import TrainingControl
    from onetrainer.training.devices import torch_threads, training_threads
    from onetrainer.training.distributed import world_size_from_environment
    from onetrainer.training.events import Failed
    from onetrainer.training.launcher import FAILED_PREFIX
    from onetrainer.training.runner import run_training

    config, _ = config_from_dict(json.loads(Path(args.config_path).read_text(encoding="utf-8")))
    import torch.distributed  # noqa: F401  (what the join needs, imported before saying "ready")

    import onetrainer.training.trainer  # noqa: F401

    if args.ready_path:
        Path(args.ready_path).touch()
    # CPU ranks share the machine's cores (rank 0 takes the same share); a GPU rank keeps them all.
    threads = training_threads() if config.train_device.startswith("cuda") else None
    threads = threads or max(1, training_threads() // world_size_from_environment())
    with torch_threads(threads):
        outcome = run_training(config, TrainingControl(), [], checked=True)
    if isinstance(outcome, Failed):
        print(f"{FAILED_PREFIX}{outcome.message}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    from onetrainer.training.distributed import end_worker_process

    end_worker_process(main())
