"""Settings say which model types they apply to through the capabilities a family declares (`FamilyInfo.capabilities`),
never by naming families; the five families keep the applicability they had when the settings named them."""

from __future__ import annotations

import dataclasses

import pytest

from onetrainer.config import TrainConfig
from onetrainer.config.enums import ModelType, TrainingMethod
from onetrainer.config.model_types import (
    CAPABILITIES,
    FAMILIES,
    MODEL_TYPES,
    FamilyInfo,
    PartRole,
    register_model_type,
)
from onetrainer.config.schema import BoundField, walk
from onetrainer.config.validation import context_of

# What the settings declared before capabilities existed (`families=`), by field name, as literal data: the family keys
# each applied to. `train_embedding` (of a text encoder block) was SDXL's only.
BEFORE: dict[str, frozenset[str]] = {
    "force_circular_padding": frozenset({"sd", "sdxl", "wuerstchen"}),
    "rescale_noise_scheduler_to_zero_terminal_snr": frozenset({"sd", "sdxl"}),
    "generalized_offset_noise": frozenset({"sd", "sdxl"}),
    "vb_loss_strength": frozenset({"pixart"}),
    "train_embedding": frozenset({"sdxl"}),
}


def _applied_before(bound: BoundField, ctx) -> bool:
    """Whether the field applied as it was declared: its family set instead of `needs` (and, for train_embedding,
    instead of its `when`)."""
    families = BEFORE.get(bound.spec.name)
    if families is None:
        return bound.applies(ctx)
    old = dataclasses.replace(bound.spec.meta, needs=None)
    if bound.spec.name == "train_embedding":
        old = dataclasses.replace(old, when=None, when_text="")
    unfiltered = dataclasses.replace(bound, spec=dataclasses.replace(bound.spec, meta=old))
    return ctx.family in families and unfiltered.applies(ctx)


# The families the settings named before capabilities existed; the later ones are checked by their own expectations.
FIVE = frozenset({"sd", "sdxl", "pixart", "wuerstchen", "cascade"})


@pytest.mark.parametrize(
    "model_type", [m for m, i in MODEL_TYPES.items() if i.family.key in FIVE], ids=lambda m: m.value
)
def test_every_setting_applies_where_it_did(model_type) -> None:
    config = TrainConfig(model_type=model_type)
    for method in (TrainingMethod.FINE_TUNE, TrainingMethod.LORA, TrainingMethod.EMBEDDING):
        config.training_method = method
        ctx = context_of(config)
        for bound in walk(config):
            assert bound.applies(ctx) == _applied_before(bound, ctx), (bound.path, method)


def _applies(model_type: ModelType, path: str, method: TrainingMethod = TrainingMethod.EMBEDDING) -> bool:
    config = TrainConfig(model_type=model_type, training_method=method)
    return next(b for b in walk(config) if b.path == path).applies(context_of(config))


# The families these expectations were written for: a family added since declares its own capabilities, and its
# settings follow them without an edit here (`test_settings_name_capabilities_the_families_declare` covers it).
_EXPECTED_FAMILIES = {
    "sd", "sdxl", "pixart", "sd3", "flux", "chroma", "zimage", "qwen", "qwen_edit", "wuerstchen", "cascade",
}  # fmt: skip


def _families_where(path: str, method: TrainingMethod = TrainingMethod.EMBEDDING) -> set[str]:
    return {
        info.family.key
        for mt, info in MODEL_TYPES.items()
        if info.family.key in _EXPECTED_FAMILIES and _applies(mt, path, method)
    }


def test_the_concrete_expectations() -> None:
    assert _families_where("vb_loss_strength") == {"pixart"}
    assert _families_where("force_circular_padding") == {"sd", "sdxl", "wuerstchen"}
    assert _families_where("rescale_noise_scheduler_to_zero_terminal_snr") == {"sd", "sdxl"}
    assert _families_where("generalized_offset_noise") == {"sd", "sdxl"}
    assert _families_where("text_encoder.train_embedding") == {"sdxl", "sd3", "flux"}
    assert _families_where("text_encoder_2.train_embedding") == {"sdxl", "sd3", "flux"}
    assert _families_where("text_encoder.layer_skip") == {
        "sd", "sdxl", "pixart", "sd3", "flux", "chroma", "zimage", "qwen", "qwen_edit",
    }  # fmt: skip
    assert _families_where("text_encoder_2.layer_skip") == {"sdxl", "sd3", "flux"}
    assert _families_where("text_encoder_3.layer_skip") == {"sd3"}
    assert _families_where("transformer.guidance_scale", TrainingMethod.LORA) == {"flux"}
    assert _families_where("transformer.attention_mask", TrainingMethod.LORA) == {"flux"}
    assert _families_where("dynamic_timestep_shifting") >= {"flux", "chroma"}
    # OneTrainer shows it in Flux's T5 frame only (Chroma's T5 always sees 512 tokens, with its mask)
    assert _families_where("text_encoder_2_sequence_length", TrainingMethod.LORA) == {"flux"}
    assert not _families_where("text_encoder.train_embedding", TrainingMethod.LORA)


def test_settings_name_capabilities_the_families_declare() -> None:
    from onetrainer.config.sample_config import SampleConfig

    nodes = (TrainConfig(), SampleConfig())  # a sample definition's settings too (the config holds none by default)
    needed = {b.spec.meta.needs for node in nodes for b in walk(node) if b.spec.meta.needs is not None}
    assert needed == CAPABILITIES
    for family in FAMILIES.values():
        assert family.capabilities <= CAPABILITIES, family.key


def test_a_new_family_gets_the_settings_of_the_capabilities_it_declares(unbuilt_model_type) -> None:
    sd = MODEL_TYPES[ModelType.STABLE_DIFFUSION_15]
    family = FamilyInfo(
        key="variance_dit",
        label="Variance DiT",
        part_roles={
            "transformer": PartRole.DENOISER,
            "text_encoder": PartRole.TEXT_ENCODER,
            "text_encoder_2": PartRole.TEXT_ENCODER,
            "vae": PartRole.IMAGE_ENCODER,
        },
        bucket_step=16,
        methods=sd.family.methods,
        output_formats=sd.family.output_formats,
        capabilities=frozenset({"learned_variance"}),
    )
    undo = register_model_type(
        dataclasses.replace(sd, model_type=unbuilt_model_type, label="Variance DiT", family=family)
    )
    try:
        assert _applies(unbuilt_model_type, "vb_loss_strength")
        assert not _applies(unbuilt_model_type, "generalized_offset_noise")
        assert _applies(unbuilt_model_type, "text_encoder_2.train_embedding")  # from its two text encoders
    finally:
        undo()
    assert unbuilt_model_type not in MODEL_TYPES and "variance_dit" not in FAMILIES


def test_a_flow_matching_family_gets_the_dynamic_shift_and_the_sigma_weighting(unbuilt_model_type) -> None:
    from onetrainer.config import config_from_dict
    from onetrainer.config.enums import LossWeight
    from onetrainer.config.validation import validate

    sd = MODEL_TYPES[ModelType.STABLE_DIFFUSION_15]
    family = dataclasses.replace(sd.family, key="flow_dit", label="Flow DiT", capabilities=frozenset({"flow_matching"}))
    undo = register_model_type(dataclasses.replace(sd, model_type=unbuilt_model_type, label="Flow DiT", family=family))
    try:
        assert _applies(unbuilt_model_type, "dynamic_timestep_shifting", TrainingMethod.LORA)
        assert not _applies(ModelType.STABLE_DIFFUSION_15, "dynamic_timestep_shifting", TrainingMethod.LORA)
        # OneTrainer's key loads (no longer an ignored setting) and the SIGMA weighting is checked by capability
        config, problems = config_from_dict({"model_type": unbuilt_model_type.value, "dynamic_timestep_shifting": True})
        assert config.dynamic_timestep_shifting and not problems
        config.loss_weight_fn = LossWeight.SIGMA
        assert not [p for p in validate(config) if p.path == "loss_weight_fn"]
        config.model_type = ModelType.STABLE_DIFFUSION_15
        assert [p.message for p in validate(config) if p.path == "loss_weight_fn"] == [
            "SIGMA weights flow-matching models only, not " + sd.label
        ]
    finally:
        undo()
