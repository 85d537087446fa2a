#!/usr/bin/env python3
"""Render images from a model, a LoRA or embeddings without the GUI. Usage: see `scripts/sample.py -h`."""

import sys

import _bootstrap  # noqa: F401

from onetrainer.cli.sample import main

if __name__ == "__main__":
    sys.exit(main())
