#!/usr/bin/env python3
"""Resize, merge or average trained LoRA files. Usage: see `scripts/lora_tool.py -h`."""

import sys

import _bootstrap  # noqa: F401

from onetrainer.cli.lora_tool import main

if __name__ == "__main__":
    sys.exit(main())
