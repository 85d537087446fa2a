#!/usr/bin/env python3
"""Measure the trainer's per-step overhead, caching, the GUI's responsiveness and, with a GPU, LoRA steps of full-size
UNets. Usage: `scripts/benchmark.py -h`; figures and what they mean: docs/benchmarks.md."""

import sys

import _bootstrap  # noqa: F401

from gui.latency import benchmark_part
from onetrainer.benchmark.cli import main

if __name__ == "__main__":
    sys.exit(main(gui_part=benchmark_part))
