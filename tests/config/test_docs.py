"""docs/config.md is generated from the declarations and must be current."""

from __future__ import annotations

from onetrainer.config.reference import render
from onetrainer.config.schema import walk
from onetrainer.config.train_config import TrainConfig
from tests.conftest import ROOT


def test_config_reference_is_current():
    current = (ROOT / "docs" / "config.md").read_text(encoding="utf-8")
    assert current == render(), "docs/config.md is stale: run `python scripts/generate_config_docs.py`"


def test_every_shown_field_has_a_label_and_help():
    for bound in walk(TrainConfig(concepts=[], samples=[])):
        meta = bound.spec.meta
        assert meta.label and meta.help, bound.path
        assert bound.path.split(".")[-1] in render() or bound.path in render()
