"""Problems in the words a user knows (issue 16): the concept's name and the field's label, not a dotted path."""

from __future__ import annotations

from onetrainer.config import ConceptConfig, SampleConfig, TrainConfig
from onetrainer.config.naming import describe, field_name
from onetrainer.config.schema import Problem
from onetrainer.training.checks import run_checks


def _config() -> TrainConfig:
    config = TrainConfig()
    config.concepts = [ConceptConfig(name="dogs", path="/data/dogs"), ConceptConfig(name="cats", path="/data/cats")]
    config.samples = [SampleConfig(prompt="a cat on a sofa")]
    return config


def test_fields_are_named_by_label_and_items_by_name() -> None:
    config = _config()
    assert field_name(config, "learning_rate") == "Learning rate"
    assert field_name(config, "unet.learning_rate") == "UNet › Learning rate"
    assert field_name(config, "concepts.1.path") == "concept 'cats'"
    assert field_name(config, "samples.0.width") == "sample 'a cat on a sofa' › Width"
    config.concepts[0].name = ""
    assert field_name(config, "concepts.0.path") == "concept '/data/dogs'"  # unnamed: its folder
    # What cannot be followed stays the path (never an error while reporting one).
    assert field_name(config, "concepts.7.path") == "concepts.7.path"
    assert field_name(config, "mystery") == "mystery"


def test_a_missing_concept_folder_names_the_concept(tmp_path) -> None:
    config = _config()
    config.concepts[1].path = str(tmp_path / "cats")
    problem = next(p for p in run_checks(config) if p.path == "concepts.1.path")
    assert describe(problem, config) == f"error: concept 'cats': folder not found: {tmp_path / 'cats'}"
    assert describe(problem, config, with_path=True).startswith("error: concept 'cats' (concepts.1.path): folder")
    assert describe(Problem("", "the file is broken"), config) == "error: the file is broken"
