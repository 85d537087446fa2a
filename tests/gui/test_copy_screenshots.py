"""scripts/copy_screenshots.py: the README's screenshots, copied small into docs/images (no display needed)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from PIL import Image

ROOT = Path(__file__).resolve().parents[2]


def _load():
    spec = importlib.util.spec_from_file_location("copy_screenshots", ROOT / "scripts" / "copy_screenshots.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_chosen_screenshots_are_copied_small(tmp_path: Path, capsys) -> None:
    script = _load()
    source, dest = tmp_path / "shots", tmp_path / "images"
    source.mkdir()
    for name in script.CHOSEN:
        # Noise compresses badly: the script has to scale it down to meet the limit.
        Image.effect_noise((640, 400), 60).convert("RGB").save(source / name)
    assert script.main(["--source", str(source), "--dest", str(dest), "--max-bytes", "100000"]) == 0
    for target in script.CHOSEN.values():
        written = dest / target
        assert written.stat().st_size <= 100_000
        with Image.open(written) as image:
            assert image.format == "PNG" and image.mode == "P"
    assert "main-window.png" in capsys.readouterr().out


def test_missing_screenshots_are_named(tmp_path: Path, capsys) -> None:
    script = _load()
    assert script.main(["--source", str(tmp_path), "--dest", str(tmp_path / "out")]) == 1
    assert "Run the GUI tests first" in capsys.readouterr().err and not (tmp_path / "out").exists()
