#!/usr/bin/env python3
"""Regenerate docs/config.md from the config's field declarations."""

import sys

import _bootstrap

from onetrainer.config.reference import render
from onetrainer.util.fs import atomic_write_text

TARGET = _bootstrap.ROOT / "docs" / "config.md"

if __name__ == "__main__":
    atomic_write_text(TARGET, render())
    print(f"wrote {TARGET}")
    sys.exit(0)
