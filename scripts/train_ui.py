#!/usr/bin/env python3
"""Open the app. Usage: `python scripts/train_ui.py [--preset NAME] [--config-path FILE]` (see -h)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

import _bootstrap  # noqa: F401  (puts the repository root on sys.path)


def main(argv: Sequence[str] | None = None) -> int:
    from gui.app import main as app_main

    return app_main(argv)


if __name__ == "__main__":
    sys.exit(main())
