#!/usr/bin/env python3
"""Train from a config without the GUI. Usage: see `scripts/train.py -h` or the README."""

import sys

import _bootstrap  # noqa: F401

from onetrainer.cli.train import main

if __name__ == "__main__":
    sys.exit(main())
