"""The noise package sits below the families and the trainer: it imports only config enums, util and (inside a
function) the sampling schedulers; the TrainConfig only for type checking."""

from __future__ import annotations

import ast

from tests.conftest import ROOT

ALLOWED = ("onetrainer.noise", "onetrainer.config.enums", "onetrainer.util")
ALLOWED_IN_FUNCTIONS = ("onetrainer.sampling.schedulers",)
ALLOWED_FOR_TYPES = ("onetrainer.config",)


def _imports(node: ast.AST) -> list[str]:
    names = []
    for child in ast.walk(node):
        if isinstance(child, ast.ImportFrom) and child.module:
            names.append(child.module)
        elif isinstance(child, ast.Import):
            names.extend(alias.name for alias in child.names)
    return [n for n in names if n.split(".")[0] == "onetrainer"]


def _allowed(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def test_the_noise_package_imports_only_what_lies_below_it():
    for path in sorted((ROOT / "onetrainer" / "noise").glob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
                allowed = ALLOWED + ALLOWED_FOR_TYPES
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                allowed = ALLOWED
            else:  # inside functions and classes
                allowed = ALLOWED + ALLOWED_IN_FUNCTIONS
            for name in _imports(node):
                assert _allowed(name, allowed), f"{path.name} imports {name}"
