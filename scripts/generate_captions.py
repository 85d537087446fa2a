#!/usr/bin/env python3
"""Write <image>.txt captions for a folder of images. Usage: see `scripts/generate_captions.py -h`."""

import sys

import _bootstrap  # noqa: F401

from onetrainer.cli.generate_captions import main

if __name__ == "__main__":
    sys.exit(main())
