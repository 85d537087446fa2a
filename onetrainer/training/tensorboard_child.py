"""`python tensorboard_child.py ARGS` (run by its path, so it needs nothing importable but TensorBoard): TensorBoard's
own `main` with ARGS, ended as soon as its
standard input closes, which happens when the process that started it ends in any way (even killed with SIGKILL).
So a TensorBoard server never outlives the training run and never keeps its port taken."""

from __future__ import annotations

import os
import sys
import threading


def exit_when_parent_ends(code: int = 0) -> None:
    """Block until standard input closes, then end the process with `code` (also used by the rank workers)."""
    # The raw descriptor, not sys.stdin: a thread blocked in a buffered read would hold its lock at shutdown.
    try:
        while os.read(0, 1024):
            pass
    except OSError:
        pass
    os._exit(code)


def main() -> None:
    threading.Thread(target=exit_when_parent_ends, name="parent-watch", daemon=True).start()
    # Run by path, this folder comes first on sys.path, and its tensorboard.py would hide the real package.
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    from tensorboard import main as tensorboard_main

    sys.argv = ["tensorboard", *sys.argv[1:]]
    tensorboard_main.run_main()


if __name__ == "__main__":
    main()
