#!/usr/bin/env python3
"""Copy the README's screenshots from the GUI tests' output into docs/images/, made small.

The GUI tests (tests/gui, under Xvfb) save screenshots in the git-ignored test-artifacts/screenshots/; this script
picks the ones the README shows and writes them as palette PNGs (256 colours: crisp for a UI, a fraction of the
size), scaled down when one is still over the size limit.

    .venv/bin/python -m pytest tests/gui      # makes the screenshots
    .venv/bin/python scripts/copy_screenshots.py
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "test-artifacts" / "screenshots"
DEST = ROOT / "docs" / "images"
MAX_BYTES = 300_000

# The test's screenshot → the name in docs/images/.
CHOSEN = {
    "main-window-trained.png": "main-window.png",  # the training tab after the demo trained (footer at 100%)
    "tab-concepts.png": "concepts-tab.png",
    "concept-window-image.png": "concept-window.png",
    "dataset-tool.png": "dataset-tool.png",  # with a painted mask
}


def small_png(source: Path, dest: Path, max_bytes: int = MAX_BYTES) -> int:
    """Write `source` as a 256-colour PNG at `dest`, scaled down until it fits in `max_bytes`; returns its size."""
    image = Image.open(source).convert("RGB")
    scale = 1.0
    while True:
        size = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
        frame = image if scale == 1.0 else image.resize(size, Image.Resampling.LANCZOS)
        frame.quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(
            dest, format="PNG", optimize=True
        )
        written = dest.stat().st_size
        if written <= max_bytes or scale < 0.3:
            return written
        scale *= 0.8


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, default=SOURCE, help=f"the tests' screenshots (default: {SOURCE})")
    parser.add_argument("--dest", type=Path, default=DEST, help=f"where the README's images go (default: {DEST})")
    parser.add_argument("--max-bytes", type=int, default=MAX_BYTES, help="the largest file (default: %(default)s)")
    args = parser.parse_args(argv)
    missing = [name for name in CHOSEN if not (args.source / name).is_file()]
    if missing:
        print(f"error: not found in {args.source}: {', '.join(missing)}", file=sys.stderr)
        print("Run the GUI tests first: .venv/bin/python -m pytest tests/gui", file=sys.stderr)
        return 1
    args.dest.mkdir(parents=True, exist_ok=True)
    for name, target in CHOSEN.items():
        written = small_png(args.source / name, args.dest / target, args.max_bytes)
        print(f"{args.dest / target}  ({written // 1024} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
