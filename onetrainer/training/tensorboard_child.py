"""`python -m onetrainer.training.tensorboard_child ARGS`: TensorBoard's own `main` with ARGS, ended as soon as its
standard input closes, which happens when the process that started it ends in any way (even killed with SIGKILL).
So a TensorBoard server never outlives the training run and never keeps its port taken."""

from __future__ import annotations

import os
import sys
import threading


def _exit_when_parent_ends() -> None:
    try:
        while sys.stdin.buffer.read(1024):
            pass
    except (OSError, ValueError):
        pass
    os._exit(0)


def main() -> None:
    threading.Thread(target=_exit_when_parent_ends, name="parent-watch", daemon=True).start()
    from tensorboard import main as tensorboard_main

    sys.argv = ["tensorboard", *sys.argv[1:]]
    tensorboard_main.run_main()


if __name__ == "__main__":
    main()
