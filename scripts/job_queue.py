#!/usr/bin/env python3
"""The queue of training runs: add, list, move, remove, run. Usage: see `scripts/job_queue.py -h` or the README.

Named job_queue, not queue: a scripts/queue.py would hide Python's own `queue` module from everything it imports."""

import sys

import _bootstrap  # noqa: F401

from onetrainer.cli.job_queue import main

if __name__ == "__main__":
    sys.exit(main())
