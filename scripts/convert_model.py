#!/usr/bin/env python3
"""Convert a model or LoRA between file layouts. Usage: see `scripts/convert_model.py -h`."""

import sys

import _bootstrap  # noqa: F401

from onetrainer.cli.convert_model import main

if __name__ == "__main__":
    sys.exit(main())
