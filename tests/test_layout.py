"""Project-wide rules: ruff is clean, and the core library never imports the GUI."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from tests.conftest import ROOT


def _ruff() -> list[str]:
    exe = shutil.which("ruff", path=str(ROOT / ".venv" / "bin")) or shutil.which("ruff")
    if exe is None:
        pytest.skip("ruff is not installed (./scripts/test.sh installs it)")
    return [exe]


def test_ruff_check_is_clean():
    result = subprocess.run([*_ruff(), "check", "."], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format_is_clean():
    result = subprocess.run([*_ruff(), "format", "--check", "."], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_core_never_imports_the_gui():
    for path in (ROOT / "onetrainer").rglob("*.py"):
        if path.name == "__main__.py":
            continue  # the `ui` command hands over to the GUI on purpose
        text = path.read_text(encoding="utf-8")
        for forbidden in ("import tkinter", "from tkinter", "customtkinter", "from gui", "import gui"):
            assert forbidden not in text, f"{path.relative_to(ROOT)} contains '{forbidden}'"
    code = (
        "import pkgutil, importlib, sys, onetrainer\n"
        "for m in pkgutil.walk_packages(onetrainer.__path__, 'onetrainer.'):\n"
        "    if not m.name.endswith('__main__'): importlib.import_module(m.name)\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('tkinter', 'customtkinter', 'gui')]\n"
        "assert not bad, bad\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]


def _string_constants(tree) -> list[str]:
    import ast

    return [node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)]


def test_families_config_and_training_know_no_tiny_models():
    """`tiny:` names are resolved to local paths before a family loads, by the source `onetrainer/tiny/source.py`
    registers (`families/sources.py`): the families, the config and the training package (the run, its checks, the
    estimate) import nothing of `onetrainer.tiny` and hold no `tiny:` name or prefix in their code. Prose that
    documents the feature (the base model's help text lists the names) is not code: only a string that is a `tiny:`
    name or the prefix counts, and comments are not looked at."""
    import ast

    for package in ("families", "config", "training"):
        for path in (ROOT / "onetrainer" / package).rglob("*.py"):
            where = path.relative_to(ROOT)
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.module:
                    assert not node.module.startswith("onetrainer.tiny"), f"{where} imports {node.module}"
                elif isinstance(node, ast.Import):
                    for alias in node.names:
                        assert not alias.name.startswith("onetrainer.tiny"), f"{where} imports {alias.name}"
            for text in _string_constants(tree):
                assert not text.strip().startswith("tiny:"), f"{where} holds the string {text[:40]!r}"
