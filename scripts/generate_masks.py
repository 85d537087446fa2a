#!/usr/bin/env python3
"""Write <image>-masklabel.png masks for a folder of images. Usage: see `scripts/generate_masks.py -h`."""

import sys

import _bootstrap  # noqa: F401

from onetrainer.cli.generate_masks import main

if __name__ == "__main__":
    sys.exit(main())
