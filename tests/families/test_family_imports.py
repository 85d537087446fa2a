"""The families' import rules, read from the source (no torch): a family module imports no other family module (what
several share lives in a neutral module), and no module of `families/` imports the methods, which sit above them."""

from __future__ import annotations

import ast
from pathlib import Path

from onetrainer.families import FAMILY_CLASSES

FAMILIES_DIR = Path(__file__).resolve().parents[2] / "onetrainer" / "families"
FAMILY_MODULES = {path.partition(":")[0] for path in FAMILY_CLASSES.values()}


def imported_modules(path: Path) -> set[str]:
    """Every module the file imports, at the top or inside a function (`from a import b` counts as `a` and `a.b`)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_no_family_module_imports_another():
    for path in sorted(FAMILIES_DIR.glob("*.py")):
        own = f"onetrainer.families.{path.stem}"
        crossing = sorted((imported_modules(path) & FAMILY_MODULES) - {own})
        assert not crossing, f"{path.name} imports the family module(s) {crossing}"


def test_no_families_module_imports_the_methods():
    for path in sorted(FAMILIES_DIR.glob("*.py")):
        upward = sorted(m for m in imported_modules(path) if m.startswith("onetrainer.methods"))
        assert not upward, f"{path.name} imports {upward}"
