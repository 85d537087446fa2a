"""Tiny tool models (ClipSeg, BLIP, BLIP-2, Florence-2, u2net, WD14), built once per test session."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from onetrainer.tiny import tools


@pytest.fixture(scope="session")
def tiny_tool_model(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """name (clipseg, blip, blip2, florence2, u2net, wd14) → its folder (u2net: its .onnx file)."""
    root = tmp_path_factory.mktemp("tiny-tools")
    built: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in built:
            target = root / (f"{name}.onnx" if name == "u2net" else name)
            built[name] = getattr(tools, f"write_tiny_{name}")(target)
        return built[name]

    return get
