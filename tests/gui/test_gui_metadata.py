"""The form generator's decisions, read from the config metadata (no display needed)."""

from __future__ import annotations

import pytest

from gui.forms.selection import arrange_groups, form_fields, item_field, split_columns
from gui.forms.values import check_value, choice_label, choice_options, display_text, parse_number, to_json
from gui.labels import NOT_TRAINABLE_SUFFIX, model_type_choices, model_type_label, offered_methods
from gui.preset_menu import preset_tree
from gui.tabs import TABS, visible_tabs
from onetrainer.config import ConceptConfig, TrainConfig, list_presets
from onetrainer.config.enums import DataType, ModelType, Optimizer, TimeUnit, TrainingMethod
from onetrainer.config.model_types import MODEL_TYPES, SUPPORTED_MODEL_TYPES
from onetrainer.config.schema import FieldType, walk
from onetrainer.config.validation import context_of
from onetrainer.families import is_trainable

FORM_TABS = [t.key for t in TABS]


def _config(model_type: ModelType, method: TrainingMethod) -> TrainConfig:
    config = TrainConfig()
    config.model_type, config.training_method = model_type, method
    return config


def test_form_fields_follow_the_metadata() -> None:
    config = TrainConfig()
    for tab in FORM_TABS:
        for info in form_fields(config, tab):
            assert info.bound.tab == tab
            assert info.meta.ui and not info.meta.ignored
            assert info.spec.type.kind in ("bool", "int", "float", "str", "enum")


def test_unit_fields_sit_beside_their_value_and_not_alone() -> None:
    fields = {f.path: f for tab in FORM_TABS for f in form_fields(TrainConfig(), tab)}
    assert fields["sample_after"].unit is not None and fields["sample_after"].unit.path == "sample_after_unit"
    assert fields["unet.stop_training_after"].unit.path == "unet.stop_training_after_unit"
    for unit in ("sample_after_unit", "backup_after_unit", "save_every_unit", "validate_after_unit"):
        assert unit not in fields
    assert "unet.stop_training_after_unit" not in fields


def test_hidden_and_list_fields_are_not_in_forms() -> None:
    paths = {f.path for tab in FORM_TABS for f in form_fields(TrainConfig(), tab)}
    for hidden in ("concepts", "samples", "optimizer.beta1", "force_v_prediction", "optimizer_defaults"):
        assert hidden not in paths
    assert "optimizer.optimizer" in paths and "compile" in paths  # built: a setting of the training tab


@pytest.mark.parametrize("model_type", SUPPORTED_MODEL_TYPES, ids=lambda m: m.value)
def test_applicability_comes_from_the_metadata(model_type: ModelType) -> None:
    for method in offered_methods(model_type):
        config = _config(model_type, method)
        ctx = context_of(config)
        shown = {f.path for tab in FORM_TABS for f in form_fields(config, tab) if f.applies(ctx)}
        parts = MODEL_TYPES[model_type].family.parts
        # A part's weight dtype shows exactly for the parts the family has.
        for part in ("unet", "prior", "transformer", "text_encoder_2", "vae", "decoder"):
            assert (f"{part}.weight_dtype" in shown) == (part in parts), (part, method)
        assert ("lora_rank" in shown) == (method is TrainingMethod.LORA)
        assert ("embedding.placeholder" in shown) == (method is TrainingMethod.EMBEDDING)
        assert ("custom_conditioning_image" in shown) == MODEL_TYPES[model_type].inpainting
        # Every shown field agrees with walk(): same path, applies.
        everything = {b.path: b for b in walk(config, into_lists=False)}
        assert all(everything[p].applies(ctx) for p in shown)


def test_groups_keep_the_tab_settings_first() -> None:
    config = TrainConfig()
    ctx = context_of(config)
    fields = [f for f in form_fields(config, "training") if f.applies(ctx)]
    titles = [title for title, _ in arrange_groups(fields, "Training")]
    assert titles[0] == "Optimizer"
    assert titles.index("UNet") > titles.index("Layer filter")  # a part-only group follows the tab's own groups
    assert "Text Encoder" in titles  # the part's fields, clip skip among them, form its group


def test_split_columns_balances_and_keeps_order() -> None:
    assert split_columns([5, 5, 5], 3) == [[0], [1], [2]]
    assert split_columns([3], 3) == [[0], [], []]
    columns = split_columns([12, 3, 4, 2, 6, 8, 5, 3], 3)
    assert [i for column in columns for i in column] == list(range(8))
    heights = [sum([12, 3, 4, 2, 6, 8, 5, 3][i] for i in column) for column in columns]
    assert max(heights) - min(heights) <= 8


def test_parse_number() -> None:
    integer, number = FieldType("int"), FieldType("float")
    assert parse_number("12", integer) == (True, 12, "")
    assert parse_number(" 1e3 ", integer) == (True, 1000, "")
    assert parse_number("1.5", integer)[0] is False
    assert parse_number("abc", number)[0] is False
    assert parse_number("3e-6", number) == (True, 3e-6, "")
    assert parse_number("inf", number) == (True, float("inf"), "")
    assert parse_number("nan", number)[0] is False
    assert parse_number("", number) == (False, None, "needs a value")
    assert parse_number("", FieldType("float", nullable=True)) == (True, None, "")


def test_display_and_choices() -> None:
    assert display_text(3e-6) == "3e-06" and display_text(None) == "" and display_text(float("inf")) == "inf"
    assert display_text(DataType.FLOAT_16) == "FLOAT_16"
    spec = TrainConfig.spec("output_dtype")
    assert choice_options(spec) == [DataType.FLOAT_32, DataType.FLOAT_16, DataType.BFLOAT_16]
    assert choice_label(None) == "(none)"
    assert to_json(Optimizer.ADAMW) == "ADAMW"


def test_check_value_uses_the_range_without_touching_the_config() -> None:
    spec = TrainConfig.spec("learning_rate_min_factor")
    assert check_value(spec, "learning_rate_min_factor", 0.5) == []
    problems = check_value(spec, "learning_rate_min_factor", 2.0)
    assert problems and "out of range" in problems[0].message


def test_item_field_paths() -> None:
    info = item_field(ConceptConfig(), "concepts", 3, "path")
    assert info.path == "concepts.3.path" and info.meta.widget == "dir"


def test_model_type_menu_marks_families_that_cannot_train_yet(unbuilt_model_type) -> None:
    labels = dict((mt, label) for label, mt in model_type_choices())
    assert set(labels) == set(SUPPORTED_MODEL_TYPES)
    for model_type, label in labels.items():
        assert label.startswith(MODEL_TYPES[model_type].label)
        assert label.endswith(NOT_TRAINABLE_SUFFIX) != is_trainable(model_type)
    assert model_type_label(unbuilt_model_type).endswith("(not trainable yet)")


def test_tabs_follow_the_method() -> None:
    for method in TrainingMethod:
        if method not in offered_methods(ModelType.STABLE_DIFFUSION_15):
            continue
        keys = [t.key for t in visible_tabs(context_of(_config(ModelType.STABLE_DIFFUSION_15, method)))]
        assert ("lora" in keys) == (method is TrainingMethod.LORA)
        assert ("embedding" in keys) == (method is TrainingMethod.EMBEDDING)
        assert keys[:7] == ["general", "model", "data", "concepts", "training", "sampling", "backup"]


def test_preset_tree_mirrors_the_folders() -> None:
    tree = preset_tree(["sd15/lora", "demo", "sd15/finetune", "a/b/c"])
    assert tree == {
        "a": {"b": {"c": "a/b/c"}},
        "demo": "demo",
        "sd15": {"finetune": "sd15/finetune", "lora": "sd15/lora"},
    }
    real = preset_tree(list_presets())
    assert all(isinstance(v, dict | str) for v in real.values())


def test_unit_choices_are_offered() -> None:
    spec = TrainConfig.spec("sample_after_unit")
    assert TimeUnit.ALWAYS not in choice_options(spec) and TimeUnit.MINUTE in choice_options(spec)


def test_clip_skip_is_a_setting_of_each_text_encoder() -> None:
    """Clip skip sits in each text encoder's group on the training tab, for the families whose encoding reads it."""
    for model_type, expected in (
        (ModelType.STABLE_DIFFUSION_XL_10_BASE, {"text_encoder.layer_skip", "text_encoder_2.layer_skip"}),
        (ModelType.STABLE_DIFFUSION_15, {"text_encoder.layer_skip"}),
        (ModelType.WUERSTCHEN_2, set()),  # Würstchen's text encoding has no clip skip
    ):
        config = _config(model_type, TrainingMethod.LORA)
        ctx = context_of(config)
        shown = {f.path for f in form_fields(config, "training") if f.applies(ctx)}
        assert {p for p in shown if p.endswith("layer_skip")} == expected, model_type
