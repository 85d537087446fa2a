"""OneTrainer's older config versions migrate to the current one; each step has a test."""

from __future__ import annotations

from onetrainer.config import config_from_dict, errors
from onetrainer.config.enums import LossWeight, ModelFormat, Optimizer, TimestepDistribution, TimeUnit


def load(data):
    config, problems = config_from_dict(data)
    return config, problems


def test_no_version_counts_as_current():
    config, problems = load({"save_every": 5})
    assert problems == [] and config.save_every == 5


def test_v0_flat_optimizer_keys_move_into_the_block():
    config, problems = load({"__version": 0, "optimizer": "PRODIGY", "optimizer_d_coef": 0.5, "optimizer_beta1": 0.9})
    assert errors(problems) == []
    assert config.optimizer.optimizer is Optimizer.PRODIGY
    assert config.optimizer.d_coef == 0.5 and config.optimizer.beta1 == 0.9
    assert config.optimizer_defaults["PRODIGY"].d_coef == 0.5


def test_v1_flat_part_keys_move_into_part_blocks():
    config, problems = load(
        {
            "__version": 1,
            "train_text_encoder": False,
            "unet_learning_rate": 1e-5,
            "train_text_encoder_epochs": 7,
            "vae_weight_dtype": "FLOAT_16",
        }
    )
    assert errors(problems) == []
    assert config.text_encoder.train is False
    assert config.unet.learning_rate == 1e-5
    assert config.text_encoder.stop_training_after == 7
    assert config.text_encoder.stop_training_after_unit is TimeUnit.EPOCH
    assert config.vae.weight_dtype.value == "FLOAT_16"


def test_v2_min_snr_gamma_becomes_a_loss_weight():
    config, _ = load({"__version": 2, "min_snr_gamma": 5.0})
    assert config.loss_weight_fn is LossWeight.MIN_SNR_GAMMA and config.loss_weight_strength == 5.0
    config, _ = load({"__version": 2, "model_type": "WUERSTCHEN_2"})
    assert config.loss_weight_fn is LossWeight.P2 and config.loss_weight_strength == 1.0


def test_v3_old_sigmoid_noising_moves_its_bias():
    config, _ = load({"__version": 3, "noising_weight": 2.0, "noising_bias": 0.7})
    assert config.timestep_distribution is TimestepDistribution.SIGMOID
    assert abs(config.noising_bias - 0.2) < 1e-9
    config, _ = load({"__version": 3})
    assert config.timestep_distribution is TimestepDistribution.UNIFORM


def test_v4_and_v10_global_checkpointing_fans_out_per_part():
    config, problems = load({"__version": 4, "gradient_checkpointing": False})
    assert errors(problems) == []
    assert config.unet.gradient_checkpointing is False and config.text_encoder.gradient_checkpointing is False


def test_v10_offloading_fans_out_only_with_cpu_offloaded_checkpointing():
    # OneTrainer's layer and activation offloading applied only with gradient_checkpointing CPU_OFFLOADED.
    old = {"__version": 10, "layer_offload_fraction": 0.5, "enable_activation_offloading": False}
    config, problems = load({**old, "gradient_checkpointing": "CPU_OFFLOADED", "enable_async_offloading": False})
    assert problems == []
    assert config.unet.gradient_checkpointing and config.unet.offload_fraction == 0.5
    assert config.text_encoder.offload_fraction == 0.5 and config.unet.activation_offloading is False
    assert config.vae.offload_fraction == 0.0 and config.async_offloading is False  # an auxiliary part keeps its own
    config, problems = load({**old, "gradient_checkpointing": "ON"})
    assert problems == [] and config.unet.offload_fraction == 0.0 and config.unet.gradient_checkpointing
    config, _ = load({"__version": 10, "gradient_checkpointing": "CPU_OFFLOADED"})
    assert config.unet.activation_offloading is True and config.unet.offload_fraction == 0.0


def test_v5_save_after_is_renamed():
    config, _ = load({"__version": 5, "save_after": 3, "save_after_unit": "EPOCH"})
    assert config.save_every == 3 and config.save_every_unit is TimeUnit.EPOCH


def test_v6_v7_lora_layers_become_layer_filter():
    config, problems = load(
        {"__version": 6, "lora_layer_preset": None, "lora_layers": "attn1", "lora_layers_regex": True}
    )
    assert errors(problems) == []
    assert config.layer_filter_preset == "full" and config.layer_filter == "attn1" and config.layer_filter_regex


def test_v8_prior_is_copied_to_transformer_outside_wuerstchen():
    config, _ = load({"__version": 8, "model_type": "PIXART_ALPHA", "prior": {"learning_rate": 2e-5}})
    assert config.transformer.learning_rate == 2e-5


def test_v9_part_dtype_none_takes_the_global_dtype():
    config, problems = load({"__version": 9, "weight_dtype": "BFLOAT_16", "unet": {"weight_dtype": "NONE"}})
    assert errors(problems) == []
    assert config.unet.weight_dtype.value == "BFLOAT_16"


def test_v10_old_safetensors_format_becomes_legacy():
    config, _ = load({"__version": 10, "training_method": "LORA", "output_model_format": "SAFETENSORS"})
    assert config.output_model_format is ModelFormat.LEGACY_LORA
    config, _ = load({"__version": 10, "training_method": "FINE_TUNE", "output_model_format": "SAFETENSORS"})
    assert config.output_model_format is ModelFormat.LEGACY_SAFETENSORS


def test_concept_migrations():
    config, problems = load({"concepts": [{"__version": 0, "repeats": 2.5, "validation_concept": True}]})
    assert errors(problems) == []
    assert config.concepts[0].balancing == 2.5 and config.concepts[0].type.value == "VALIDATION"


def test_onetrainer_clip_skip_keys_load_into_the_text_encoder_parts(tmp_path):
    """OneTrainer keeps clip skip beside the part blocks; here it is the part's `layer_skip`. Its keys load at any
    version and without one (OneTrainer's presets carry none), in a preset layer, and with --set."""
    from onetrainer.config import load_layers, save_config
    from onetrainer.config.io import read_config_dict

    for version in ({"__version": 11}, {"__version": 4}, {}):
        config, problems = load({**version, "text_encoder_layer_skip": 2, "text_encoder_2_layer_skip": 1})
        assert problems == [] and (config.text_encoder.layer_skip, config.text_encoder_2.layer_skip) == (2, 1)
    # the block's own value wins over OneTrainer's key; a block's other settings stay
    config, _ = load({"text_encoder_layer_skip": 2, "text_encoder": {"layer_skip": 3, "train": False}})
    assert config.text_encoder.layer_skip == 3 and config.text_encoder.train is False
    preset = tmp_path / "preset.json"
    preset.write_text('{"model_type": "STABLE_DIFFUSION_XL_10_BASE", "text_encoder_2_layer_skip": 2}')
    config, problems = load_layers(str(preset), overrides=["text_encoder_layer_skip=1"])
    assert errors(problems) == [] and (config.text_encoder.layer_skip, config.text_encoder_2.layer_skip) == (1, 2)
    # saved once, at its own place (as every OneTrainer name this trainer stores elsewhere)
    save_config(config, tmp_path / "saved.json")
    saved = read_config_dict(tmp_path / "saved.json")
    assert "text_encoder_layer_skip" not in saved and saved["text_encoder_2"]["layer_skip"] == 2
