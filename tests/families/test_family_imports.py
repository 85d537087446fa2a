"""The families' import rules, read from the source (no torch): a family module imports no other family module nor
another's declaration (what several share lives in a neutral module; a variant's own module, `<base>_<variant>.py`,
may build on its base family's), no module of `families/` imports the methods,
which sit above them, and the declarations read without torch."""

from __future__ import annotations

import ast
from pathlib import Path

from onetrainer.families import FAMILY_CLASSES
from onetrainer.families.registry import DECLARATION_SUFFIX

FAMILIES_DIR = Path(__file__).resolve().parents[2] / "onetrainer" / "families"
FAMILY_MODULES = {path.partition(":")[0] for path in FAMILY_CLASSES.values()}
# A family module and its declaration beside it (`<module>_info`) are one family's.
FAMILY_MODULES |= {module + DECLARATION_SUFFIX for module in FAMILY_MODULES}


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


def extended(module: str) -> set[str]:
    """The family module a variant's own module extends, and its declaration: `wan_i2v` (Wan 2.1 I2V) builds on
    `wan` (a family module's name, then `_` and the variant's)."""
    stem = module.rpartition(".")[2]
    bases = {m for m in FAMILY_MODULES if stem.startswith(m.rpartition(".")[2] + "_") and m != module}
    return bases | {m + DECLARATION_SUFFIX for m in bases}


def test_no_family_module_imports_another():
    for path in sorted(FAMILIES_DIR.glob("*.py")):
        module = f"onetrainer.families.{path.stem.removesuffix(DECLARATION_SUFFIX)}"
        own = {module, module + DECLARATION_SUFFIX} | (extended(module) if module in FAMILY_MODULES else set())
        crossing = sorted((imported_modules(path) & FAMILY_MODULES) - own)
        assert not crossing, f"{path.name} imports the family module(s) {crossing}"


def test_no_families_module_imports_the_methods():
    for path in sorted(FAMILIES_DIR.glob("*.py")):
        upward = sorted(m for m in imported_modules(path) if m.startswith("onetrainer.methods"))
        assert not upward, f"{path.name} imports {upward}"


def test_the_declarations_read_without_torch():
    """The model-type table gathers every family's declaration (`families/<module>_info.py`) without importing torch:
    the GUI and the config read them."""
    import subprocess
    import sys

    code = (
        "import sys\nfrom onetrainer.config import model_types\nfrom onetrainer.families import registry\n"
        "assert len(model_types.FAMILIES) == len(registry.BUILT_IN_FAMILIES), model_types.FAMILIES\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'diffusers', 'transformers')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
