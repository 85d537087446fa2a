#!/usr/bin/env python3
"""Write a default training config with its concepts and samples files."""

import sys

import _bootstrap  # noqa: F401

from onetrainer.cli.create_train_files import main

if __name__ == "__main__":
    sys.exit(main())
