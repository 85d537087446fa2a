"""Loading, validating and writing the one config."""

from __future__ import annotations

import json
import os

import pytest

from onetrainer.config import TrainConfig, config_from_dict, errors, load_config, save_config, warnings
from onetrainer.config.enums import DataType, ModelFormat, ModelType, TimeUnit, TrainingMethod
from onetrainer.config.schema import Severity, get_path, set_path, walk


def test_sparse_json_takes_defaults():
    config, problems = config_from_dict({"learning_rate": 1e-4})
    assert problems == []
    assert config.learning_rate == 1e-4
    assert config.batch_size == TrainConfig().batch_size
    assert config.text_encoder.stop_training_after == 30
    assert config.text_encoder.stop_training_after_unit is TimeUnit.EPOCH
    assert config.unet.stop_training_after_unit is TimeUnit.NEVER


def test_defaults_round_trip_through_json():
    config = TrainConfig()
    text = json.dumps(config.to_dict())
    again, problems = config_from_dict(json.loads(text))
    assert problems == []
    assert again == config
    assert json.loads(text)["__version"] == 11


def test_unknown_key_is_a_warning_naming_it():
    _, problems = config_from_dict({"learning_rat": 1.0, "unet": {"trian": False}})
    assert [p.severity for p in problems] == [Severity.WARNING, Severity.WARNING]
    assert problems[0].path == "learning_rat" and "learning_rate" in problems[0].message
    assert problems[1].path == "unet.trian"


@pytest.mark.parametrize(
    ("data", "path", "fragment"),
    [
        ({"batch_size": "four"}, "batch_size", "an integer"),
        ({"batch_size": 0}, "batch_size", "1 or more"),
        ({"learning_rate_min_factor": 1.5}, "learning_rate_min_factor", "0 to 0.99"),
        ({"model_type": "STABLE_DIFFUSION_99"}, "model_type", "STABLE_DIFFUSION_15"),
        ({"unet": {"weight_dtype": "NFLOAT_4"}}, "unet.weight_dtype", "frozen weights only"),
        ({"unet": {"train": "yes"}}, "unet.train", "true or false"),
        ({"concepts": [{"path": 3.5, "balancing": -1}]}, "concepts.0.balancing", "0 or more"),
        ({"resolution": "512x"}, "resolution", "WIDTHxHEIGHT"),
        ({"training_method": "LORA"}, "output_model_format", "KOHYA_LORA"),
        ({"samples": [{"width": 100}]}, "samples.0.width", "multiple of 8"),
        ({"model_type": "STABLE_CASCADE_1", "samples": [{"width": 64}]}, "samples.0.width", "multiple of 128 for"),
        ({"model_type": "STABLE_CASCADE_1", "samples": [{"height": 300}]}, "samples.0.height", "(try 256 or 384)"),
    ],
)
def test_invalid_values_are_errors_naming_the_field(data, path, fragment):
    _, problems = config_from_dict(data)
    found = [p for p in errors(problems) if p.path == path]
    assert found, problems
    assert fragment in found[0].message


def test_a_model_type_no_family_builds_is_an_error_naming_the_field(unbuilt_model_type):
    _, problems = config_from_dict({"model_type": unbuilt_model_type.value})
    found = [p for p in errors(problems) if p.path == "model_type"]
    assert found and "cannot train yet: its model family is not built yet" in found[0].message


def test_all_problems_are_reported_at_once():
    _, problems = config_from_dict({"batch_size": 0, "epochs": -3, "resolution": "big", "foo": 1})
    assert {p.path for p in errors(problems)} == {"batch_size", "epochs", "resolution"}
    assert [p.path for p in warnings(problems)] == ["foo"]


def test_numbers_are_accepted_for_text_fields():
    config, problems = config_from_dict({"resolution": 768})
    assert problems == [] and config.resolution == "768"


def test_infinity_is_written_and_read_like_onetrainer():
    config = TrainConfig()
    config.optimizer.growth_rate = float("inf")
    data = config.to_dict()
    assert data["optimizer"]["growth_rate"] == "inf"
    again, problems = config_from_dict(data)
    assert problems == [] and again.optimizer.growth_rate == float("inf")


def test_ignored_onetrainer_setting_warns_only_when_it_would_matter():
    _, quiet = config_from_dict({"frames": "25", "secrets": {"huggingface_token": "", "cloud": {"user": "root"}}})
    assert quiet == []
    # an audio format: no model type here makes sound; secrets come from the secrets file only
    _, loud = config_from_dict({"sample_audio_format": "WAV", "secrets": {"cloud": {"password": "hunter2"}}})
    assert {p.path for p in loud} == {"sample_audio_format", "secrets"}
    assert not any("hunter2" in p.message for p in loud)
    assert all(p.severity is Severity.WARNING and "ignored" in p.message for p in loud)


def test_a_onetrainer_samples_copies_of_training_settings_load_quietly_and_every_ignored_key_says_why():
    """OneTrainer writes the training config's layer skips, lengths, attention mask and zero-terminal-SNR into each
    sample before sampling (`SampleConfig.from_train_config`): a samples file of a run with clip skip holds them."""
    from onetrainer.config.reference import _ignored_section

    sample = {"prompt": "a cat", "text_encoder_1_layer_skip": 1, "text_encoder_2_sequence_length": 77,
              "transformer_attention_mask": True, "force_last_timestep": True}  # fmt: skip
    config, problems = config_from_dict({"samples": [sample]})
    assert problems == [] and config.samples[0].prompt == "a cat"
    # a video sample on an image model type: its frames apply to video model types only, and loading says so
    _, [loud] = config_from_dict({"samples": [{"prompt": "a clip", "frames": 49}]})
    assert loud.path == "samples.0.frames" and loud.severity is Severity.WARNING
    assert "renders images: the sample's 49 frames are ignored" in loud.message
    _, loud = config_from_dict({"samples": [{"prompt": "a clip", "length": 4.0}]})  # an audio/video sample's length
    assert [p.path for p in loud] == ["samples.0.length"]
    lines = [line for line in _ignored_section().splitlines() if line.startswith("- `")]
    assert lines and all(": " in line and len(line.partition(": ")[2]) > 20 for line in lines)
    assert not [line for line in lines if line.endswith("'.") or line.endswith(": OneTrainer.")]  # a reason each


def test_set_path_converts_and_validates():
    config = TrainConfig()
    assert set_path(config, "unet.learning_rate", 1e-5) == []
    assert config.unet.learning_rate == 1e-5
    assert set_path(config, "concepts.0.path", "/data") == []  # creates the list and its first item
    assert get_path(config, "concepts.0.path") == "/data"
    assert set_path(config, "concepts.1.image.enable_random_flip", True) == []
    assert len(config.concepts) == 2
    problems = set_path(config, "concepts.5.path", "x")
    assert problems and "out of range" in problems[0].message
    problems = set_path(config, "unet.wieght_dtype", "FLOAT_16")
    assert problems and "weight_dtype" in problems[0].message
    assert set_path(config, "optimizer_defaults.PRODIGY.d_coef", 0.5) == []
    assert config.optimizer_defaults["PRODIGY"].d_coef == 0.5


def test_walk_reports_tabs_groups_and_parts():
    by_path = {b.path: b for b in walk(TrainConfig())}
    assert by_path["unet.train"].tab == "training" and by_path["unet.train"].part == "unet"
    assert by_path["unet.weight_dtype"].tab == "model" and by_path["unet.weight_dtype"].group == "UNet"
    assert by_path["learning_rate"].group == "Optimizer"


def test_field_applicability_follows_family_and_method():
    from onetrainer.config.validation import context_of

    config = TrainConfig()
    fields = {b.path: b for b in walk(config)}
    ctx = context_of(config)  # SD 1.5 fine-tune
    assert fields["unet.train"].applies(ctx)
    assert not fields["prior.train"].applies(ctx)
    assert not fields["text_encoder_2.train"].applies(ctx)
    assert not fields["lora_rank"].applies(ctx)
    config.model_type = ModelType.STABLE_DIFFUSION_XL_10_BASE
    config.training_method = TrainingMethod.LORA
    ctx = context_of(config)
    assert fields["text_encoder_2.train"].applies(ctx)
    assert fields["text_encoder_2.layer_skip"].applies(ctx)
    assert not fields["unet.layer_skip"].applies(ctx)
    assert fields["lora_rank"].applies(ctx)
    assert not fields["vae.train"].applies(ctx)  # image encoders and sampling parts are not trained
    assert fields["text_encoder.dropout_probability"].applies(ctx)
    assert not fields["unet.dropout_probability"].applies(ctx)


def test_save_is_atomic(tmp_path, monkeypatch):
    target = tmp_path / "config.json"
    save_config(TrainConfig(), target)
    before = target.read_text()
    changed = TrainConfig(learning_rate=0.5)

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError):
        save_config(changed, target)
    monkeypatch.undo()
    assert target.read_text() == before
    assert [p.name for p in tmp_path.iterdir()] == ["config.json"]  # no temporary file left behind
    config, problems = load_config(target)
    assert problems == [] and config.learning_rate == TrainConfig().learning_rate


def test_load_errors_name_the_file(tmp_path):
    from onetrainer.config import ConfigFileError

    bad = tmp_path / "bad.json"
    bad.write_text("{ not json")
    with pytest.raises(ConfigFileError, match=r"bad\.json.*line 1"):
        load_config(bad)
    with pytest.raises(ConfigFileError, match="not found"):
        load_config(tmp_path / "missing.json")


def test_output_format_must_fit_method_and_family():
    _, problems = config_from_dict({"training_method": "EMBEDDING", "output_model_format": "KOHYA_LORA"})
    [problem] = errors(problems)
    assert problem.path == "output_model_format" and "SAFETENSORS" in problem.message
    _, problems = config_from_dict(
        {"model_type": "WUERSTCHEN_2", "training_method": "FINE_TUNE", "output_model_format": "ORIGINAL_SINGLE_FILE"}
    )
    assert [p.path for p in errors(problems)] == ["output_model_format"]
    _, problems = config_from_dict({"model_type": "STABLE_DIFFUSION_21", "output_model_format": "DIFFUSERS"})
    assert problems == []
    assert ModelFormat.DIFFUSERS.is_directory and DataType.FLOAT_16.value == "FLOAT_16"


def test_a_partial_part_block_keeps_that_parts_defaults():
    config, problems = config_from_dict({"text_encoder": {"train": False}, "text_encoder_2": {"learning_rate": 1e-6}})
    assert problems == []
    assert config.text_encoder.train is False
    assert config.text_encoder.stop_training_after == 30  # the text encoder's own default survives
    assert config.text_encoder.stop_training_after_unit is TimeUnit.EPOCH
    assert config.text_encoder_2.stop_training_after == 30 and config.text_encoder_2.learning_rate == 1e-6
    assert config.vae.train is False


def test_a_learning_rate_of_zero_is_a_warning():
    """Backspacing "0.0003" passes through "0": a run at learning rate 0 learns nothing, and says so."""
    from onetrainer.config import validate

    config = TrainConfig(learning_rate=0.0)
    found = [p for p in validate(config) if p.path == "learning_rate"]
    assert len(found) == 1 and not found[0].is_error and "learns nothing" in found[0].message
    assert not [p for p in validate(TrainConfig()) if p.path == "learning_rate"]


def test_other_parts_blocks_load_merge_and_round_trip() -> None:
    # A config without `parts` (every OneTrainer config) loads as before; blocks of parts no family here declares
    # (a family module not loaded) are kept and written back; a block read onto a declared one keeps its defaults.
    from tests.families.tiny_dit_family import register

    old, problems = config_from_dict({"model_type": "STABLE_DIFFUSION_15"})
    own = set(TrainConfig().parts)  # the built-in families' own parts (Wan 2.1 I2V's `image_encoder`), at defaults
    assert not problems and set(old.parts) == own and all(old.parts[p] == TrainConfig().parts[p] for p in own)
    undo = register()  # a family with a part of its own (`patch_autoencoder`, an IMAGE_ENCODER)
    try:
        data = {"parts": {"patch_autoencoder": {"weight_dtype": "FLOAT_16"}, "elsewhere": {"train": False}}}
        config, problems = config_from_dict(data)
        assert not problems
        block = config.part("patch_autoencoder")
        assert block.weight_dtype is DataType.FLOAT_16 and not block.train  # an image encoder's default kept
        again, _ = config_from_dict(json.loads(json.dumps(config.to_dict())))
        assert again.to_dict() == config.to_dict() and not again.parts["elsewhere"].train
    finally:
        undo()
    with pytest.raises(KeyError):
        TrainConfig().part("patch_autoencoder")


def test_a_new_sample_starts_at_the_training_resolution() -> None:
    from onetrainer.config.resolution import sample_size

    assert sample_size("64", 8) == (64, 64)
    assert sample_size("512,768,1024", 16) == (1024, 1024)  # several sizes: the largest
    assert sample_size("1024x768", 16) == (1024, 768)
    assert sample_size("1000", 16) == (1008, 1008) and sample_size("64", 128) == (128, 128)  # the family's step
    assert sample_size("huge", 8) is None


def test_a_type_made_unbuilt_for_a_test_comes_back_in_its_place():
    """The fixture's tables come back in their order: it is the menus' and the generated docs' order."""
    from onetrainer.config.model_types import FAMILIES, MODEL_TYPES
    from tests.helpers import made_unbuilt

    before = (list(MODEL_TYPES), list(FAMILIES))
    with made_unbuilt(ModelType.HUNYUAN_VIDEO):
        assert ModelType.HUNYUAN_VIDEO not in MODEL_TYPES
    assert (list(MODEL_TYPES), list(FAMILIES)) == before
