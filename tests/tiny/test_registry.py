"""The tiny models' registry: gathered from the families' tiny modules, cheap to list, open to a family from
elsewhere (`onetrainer/tiny/registry.py`)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from onetrainer.families.registry import BUILT_IN_FAMILIES
from onetrainer.tiny import TINY_VARIANTS, register_tiny_module
from onetrainer.tiny.registry import tiny_modules


def test_listing_the_tiny_models_imports_no_model_library():
    code = (
        "import sys; from onetrainer.tiny import TINY_VARIANTS; from onetrainer.tiny.reference import width_fields; "
        "assert TINY_VARIANTS and width_fields('transformer'); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'diffusers', 'transformers')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_each_variant_comes_from_the_tiny_module_of_a_built_in_family():
    stems = set(BUILT_IN_FAMILIES) | {t.partition(":")[0].rpartition(".")[2] for t in BUILT_IN_FAMILIES.values()}
    for module in tiny_modules():
        assert module.__name__.rpartition(".")[2] in stems
        for variant in module.VARIANTS:
            assert variant.module == module.__name__ and TINY_VARIANTS[variant.name] is variant


def test_a_registered_module_lists_after_the_built_in_ones_until_undone(tmp_path, monkeypatch):
    (tmp_path / "elsewhere_tiny.py").write_text(
        "from onetrainer.config.enums import ModelType\n"
        "from onetrainer.tiny.variant import TinyVariant\n"
        "VARIANTS = (TinyVariant('elsewhere', ModelType.SANA, '', 'a family from elsewhere', __name__, {}),)\n"
    )
    (tmp_path / "clashing_tiny.py").write_text(
        "from onetrainer.tiny import TINY_VARIANTS\nVARIANTS = (TINY_VARIANTS['sd15'],)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    before = list(TINY_VARIANTS)
    undo = register_tiny_module("elsewhere_tiny")
    try:
        assert list(TINY_VARIANTS) == [*before, "elsewhere"]
        assert tiny_modules()[-1].__name__ == "elsewhere_tiny"
        with pytest.raises(ValueError, match="already known"):
            register_tiny_module("elsewhere_tiny")
    finally:
        undo()
    assert list(TINY_VARIANTS) == before
    with pytest.raises(ValueError, match="sd15"):
        register_tiny_module("clashing_tiny")
    assert list(TINY_VARIANTS) == before
