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
    text = render()
    for bound in walk(TrainConfig(concepts=[], samples=[])):
        meta = bound.spec.meta
        assert meta.label and meta.help, bound.path
        assert bound.path.split(".")[-1] in text or bound.path in text


def test_presets_and_family_fields_are_documented():
    from onetrainer.config import list_presets, load_preset
    from onetrainer.config.enums import ModelType
    from onetrainer.config.model_types import MODEL_TYPES

    EFFNET_DOWNLOAD = MODEL_TYPES[ModelType.STABLE_CASCADE_1].family.part_downloads["effnet_encoder"]

    text = render()
    presets = text.split("## Presets", 1)[1]
    for name in list_presets():
        config, _ = load_preset(name)
        assert f"| `{name}` | `{config.model_type.value}` | {config.training_method.value} |" in presets, name
    notes = text.split("## Family notes", 1)[1].split("## Presets", 1)[0]
    assert "`vb_loss_strength`" in notes and "`effnet_encoder.model_name`" in notes and EFFNET_DOWNLOAD in notes
    assert "`P2`" in notes and "**Würstchen v2**" in notes and "**Stable Cascade**" in notes


def test_every_optimizer_says_what_it_suits_and_the_readme_shows_the_usual_ones_as_generated():
    from onetrainer.config.optimizer_guide import SUITS, optimizer_guide_rows, optimizer_guide_table
    from onetrainer.config.optimizers import OPTIMIZERS

    assert set(OPTIMIZERS) <= set(SUITS)
    rows = {row.optimizer.value: row for row in optimizer_guide_rows()}
    assert rows["PRODIGY"].own_step_size and not rows["ADAMW"].own_step_size
    assert rows["PRODIGY_PLUS_SCHEDULE_FREE"].schedule_free and rows["PRODIGY_PLUS_SCHEDULE_FREE"].fused_back_pass
    assert rows["ADAMW_8BIT"].state_bytes < rows["ADAMW"].state_bytes == 8.0
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    shown = readme.split("### Choosing an optimizer", 1)[1].split("\n\n###", 1)[0]
    names = [line.split("`")[1] for line in shown.splitlines() if line.startswith("| `")]
    assert len(names) >= 5 and optimizer_guide_table([rows[name] for name in names]) in shown
