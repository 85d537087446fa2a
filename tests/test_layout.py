"""Project-wide rules: ruff is clean, the core library never imports the GUI, and the maths and the utilities never
read the config."""

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


# The maths and the mechanisms take small frozen settings built once from the config (`training/settings.py`,
# `training/processes.py`, `families/loading.quantization_settings`), never the config itself; the utilities import
# nothing of the config at all (docs/architecture.md, "Layers").
NO_TRAIN_CONFIG = ("noise", "util", "precision", "training/distributed.py", "training/sharding.py")
NO_CONFIG = ("util",)


def _imported_names(path, source: str | None = None) -> set[str]:
    """Every `module` and `module.name` a file imports: at the top, in functions and under TYPE_CHECKING alike (an
    annotation that names the config is a function that takes it)."""
    import ast

    tree = ast.parse(source if source is not None else path.read_text(encoding="utf-8"))
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            found |= {base} | {f"{base}.{alias.name}" for alias in node.names}
    return found


def _reads_train_config(names: set[str]) -> bool:
    return any(n in ("onetrainer.config.TrainConfig", "onetrainer.config.train_config") or
               n.startswith("onetrainer.config.train_config.") for n in names)  # fmt: skip


def _reads_config(names: set[str]) -> bool:
    return any(n == "onetrainer.config" or n.startswith("onetrainer.config.") for n in names)


def _files(places: tuple[str, ...]):
    for place in places:
        target = ROOT / "onetrainer" / place
        yield from sorted(target.rglob("*.py")) if target.is_dir() else [target]


def test_the_maths_take_settings_and_the_utilities_import_nothing_of_the_config():
    reading = [str(p.relative_to(ROOT)) for p in _files(NO_TRAIN_CONFIG) if _reads_train_config(_imported_names(p))]
    assert not reading, f"these import TrainConfig, where they should take small settings built from it: {reading}"
    config = [str(p.relative_to(ROOT)) for p in _files(NO_CONFIG) if _reads_config(_imported_names(p))]
    assert not config, f"these utilities import from onetrainer.config: {config}"


def test_the_config_import_check_can_fail():
    """The reading above sees an import under TYPE_CHECKING, inside a function and through a submodule."""
    path = ROOT / "onetrainer" / "util" / "planted.py"
    typing_only = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from onetrainer.config import TrainConfig\n"
    assert _reads_train_config(_imported_names(path, typing_only))
    in_function = "def f():\n    from onetrainer.config.train_config import TrainConfig\n"
    assert _reads_train_config(_imported_names(path, in_function))
    enums = "from onetrainer.config.enums import DataType\n"
    assert _reads_config(_imported_names(path, enums)) and not _reads_train_config(_imported_names(path, enums))
    assert _reads_config(_imported_names(path, "from onetrainer import config\n"))
    assert not _reads_config(_imported_names(path, "from onetrainer.util.fs import atomic_write_json\n"))
