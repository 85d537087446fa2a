"""Presets, the CLI's layering (defaults <- preset <- config <- --set) and side files."""

from __future__ import annotations

import json

import pytest

from onetrainer.config import (
    TrainConfig,
    config_from_dict,
    errors,
    list_presets,
    load_layers,
    load_preset,
    pack,
    warnings,
)
from onetrainer.config.concept_config import ConceptConfig
from onetrainer.config.enums import ModelType, TrainingMethod
from onetrainer.config.io import ConfigFileError, parse_set_value, preset_path, read_config_dict, save_side_file
from onetrainer.config.model_types import PartRole, family_of
from onetrainer.families import is_trainable

REQUIRED_PRESETS = {
    "demo",
    "sd15/finetune",
    "sd15/lora",
    "sd15/embedding",
    "sd15/masked",
    "sd15/inpainting",
    "sd15/lora-low-vram",
    "sd20/inpainting",
    "sd20/inpainting-lora",
    "sd21/finetune-768",
    "sd21/lora-768",
    "sd21/embedding-768",
    "sdxl/finetune",
    "sdxl/lora",
    "sdxl/lora-low-vram",
    "sdxl/embedding",
    "sdxl/inpainting-lora",
    "pixart/finetune",
    "pixart/finetune-512",
    "pixart/lora",
    "pixart/lora-512",
    "pixart/embedding",
    "pixart/embedding-512",
    "wuerstchen/finetune",
    "wuerstchen/lora",
    "wuerstchen/embedding",
    "cascade/finetune",
    "cascade/lora",
    "cascade/embedding",
}


def test_required_presets_exist():
    assert set(list_presets()) >= REQUIRED_PRESETS


@pytest.mark.parametrize("name", list_presets())
def test_preset_loads_over_defaults_validates_and_round_trips(name):
    config, problems = load_preset(name)
    assert problems == []
    raw = read_config_dict(preset_path(name))
    assert "__version" not in raw or raw["__version"] == TrainConfig.VERSION
    for key, value in raw.items():  # the preset is a sparse overlay: each key it names is applied
        if not isinstance(value, dict | list):
            assert json.loads(json.dumps(config.to_dict()[key])) == value, key
    again, problems = config_from_dict(json.loads(json.dumps(config.to_dict())))
    assert problems == [] and again == config


def test_sd21_768_presets_train_at_768():
    for name in ("sd21/finetune-768", "sd21/lora-768", "sd21/embedding-768"):
        config, _ = load_preset(name)
        assert config.model_type is ModelType.STABLE_DIFFUSION_21 and config.resolution == "768"


@pytest.mark.parametrize("name", ["sd15/lora-low-vram", "sdxl/lora-low-vram"])
def test_low_vram_preset_uses_the_memory_savers(name):
    config, _ = load_preset(name)
    assert config.unet.weight_dtype.value == "FLOAT_16" and config.unet.gradient_checkpointing
    assert config.latent_caching and config.optimizer.optimizer.value == "ADAMW_8BIT" and config.batch_size == 1
    encoders = family_of(config.model_type).parts_with(PartRole.TEXT_ENCODER)
    assert encoders and not any(config.part(p).train for p in encoders)  # their outputs are cached


def test_presets_of_every_family_load_and_say_whether_it_trains(monkeypatch):
    # Written to hold before and after the Würstchen / Cascade families are registered: trainability follows the
    # registry, and an unregistered family is refused with a reason naming it.
    from onetrainer import families

    for name in ("pixart/finetune", "wuerstchen/finetune", "cascade/finetune"):
        config, problems = load_preset(name)
        assert problems == []
        key = family_of(config.model_type).key
        monkeypatch.delitem(families.FAMILY_CLASSES, key, raising=False)
        reason = families.not_trainable_reason(config.model_type)
        assert not is_trainable(config.model_type) and reason and "cannot be trained yet" in reason
        monkeypatch.setitem(families.FAMILY_CLASSES, key, "never.loaded:Family")
        assert is_trainable(config.model_type) and families.not_trainable_reason(config.model_type) is None
        monkeypatch.undo()
    assert is_trainable(load_preset("pixart/finetune")[0].model_type)


@pytest.mark.parametrize("family", ["wuerstchen", "cascade"])
def test_prior_presets_train_a_bf16_prior_with_p2_loss_and_a_frozen_text_encoder(family):
    methods = set()
    for method in ("finetune", "lora", "embedding"):
        config, _ = load_preset(f"{family}/{method}")
        assert family_of(config.model_type).key == family
        assert config.prior.weight_dtype.value == "BFLOAT_16"
        assert config.loss_weight_fn.value == "P2" and config.loss_weight_strength == 1.0  # OneTrainer's gamma = 1
        assert config.text_encoder.train is False
        assert config.effnet_encoder.model_name and config.decoder.model_name
        methods.add(config.training_method)
    assert methods == {TrainingMethod.FINE_TUNE, TrainingMethod.LORA, TrainingMethod.EMBEDDING}


@pytest.mark.parametrize("resolution", ["512", "1024"])
def test_pixart_presets_cover_every_method_in_bf16_with_t5_frozen(resolution):
    suffix = "-512" if resolution == "512" else ""
    methods = set()
    for method in ("finetune", "lora", "embedding"):
        config, _ = load_preset(f"pixart/{method}{suffix}")
        assert config.model_type is ModelType.PIXART_ALPHA and config.resolution == resolution
        assert resolution in config.base_model_name  # the 512 presets start from the 512 checkpoint
        assert config.transformer.weight_dtype.value == "BFLOAT_16" and config.text_encoder.train is False
        methods.add(config.training_method)
    assert methods == {TrainingMethod.FINE_TUNE, TrainingMethod.LORA, TrainingMethod.EMBEDDING}


def test_layers_apply_in_order(in_tmp):
    (in_tmp / "cfg.json").write_text(json.dumps({"learning_rate": 0.5, "batch_size": 3, "lora_rank": 8}))
    config, problems = load_layers("sd15/lora", "cfg.json", ["batch_size=5", "lora_rank=32", "lora_rank=12"])
    assert problems == []
    assert config.training_method is TrainingMethod.LORA  # from the preset
    assert config.learning_rate == 0.5  # the config file beats the preset
    assert config.batch_size == 5 and config.lora_rank == 12  # each --set in order, last wins
    assert config.text_encoder.train is False  # a nested preset value survives a sparse config


def test_set_values_are_json_else_text():
    assert parse_set_value("3") == 3
    assert parse_set_value("1e-4") == 1e-4
    assert parse_set_value("true") is True
    assert parse_set_value("null") is None
    assert parse_set_value("[1, 2]") == [1, 2]
    assert parse_set_value("/data/cats") == "/data/cats"
    assert parse_set_value("512") == 512  # a text field still accepts it: resolution=512


def test_set_reaches_into_the_concept_file(in_tmp):
    save_side_file([ConceptConfig(name="a", path="one"), ConceptConfig(name="b", path="two")], "concepts.json")
    config, problems = load_layers(None, None, ["concept_file_name=concepts.json"])
    assert problems == [] and config.concepts is None
    packed, problems = pack(config)
    assert problems == [] and [c.path for c in packed.concepts] == ["one", "two"]
    config, problems = load_layers("sd15/lora", None, ["concept_file_name=concepts.json", "concepts.1.path=three"])
    assert problems == [] and [c.path for c in config.concepts] == ["one", "three"]


def test_bad_set_and_missing_files_are_reported():
    _, problems = load_layers("sd15/lora", None, ["nokey", "batch_size=x", "lora_rank=0"])
    assert [p.path for p in errors(problems)] == ["", "batch_size", "lora_rank"]
    with pytest.raises(ConfigFileError, match="preset 'nope' not found"):
        load_layers("nope")


def test_inline_concepts_win_over_the_concept_file(in_tmp):
    save_side_file([ConceptConfig(path="from-file")], "c.json")
    config, _ = config_from_dict({"concept_file_name": "c.json", "concepts": [{"path": "inline"}]})
    packed, _ = pack(config)
    assert [c.path for c in packed.concepts] == ["inline"]


def test_broken_concept_file_is_named(in_tmp):
    (in_tmp / "c.json").write_text('[{"path": 5, "balancing": "x"}]')
    config, _ = config_from_dict({"concept_file_name": "c.json"})
    _, problems = pack(config)
    assert [p.path for p in problems] == ["concepts.0.balancing"] and not warnings(problems)
