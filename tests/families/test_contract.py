"""The generic pieces of the family contract on small tensors: named conditioning (cache rows, stacking, dropout by
zeros) and the production code's independence from the test-support package."""

from __future__ import annotations

import subprocess
import sys
from typing import ClassVar

import pytest
import torch

from onetrainer.families.base import Conditioning
from onetrainer.families.registry import BUILT_IN_FAMILIES


def test_conditioning_rows_stack_back_and_zero_per_caption():
    hidden = torch.randn(3, 4, 8, dtype=torch.float16)
    mask = torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 1]])
    conditioning = Conditioning({"hidden_states": hidden, "attention_mask": mask, "pooled": torch.randn(3, 8)})
    rows = [conditioning.row(i) for i in range(3)]
    assert rows[0]["hidden_states"].dtype == torch.float32 and rows[0]["attention_mask"].dtype == mask.dtype
    stacked = Conditioning.stack(rows, "cpu")
    assert set(stacked.tensors) == {"hidden_states", "attention_mask", "pooled"} and len(stacked) == 3
    assert torch.equal(stacked.get("attention_mask"), mask)
    assert torch.allclose(stacked.hidden_states, hidden.float())
    dropped = stacked.zeroed(torch.tensor([False, True, False]))
    assert torch.equal(dropped.get("attention_mask")[1], torch.zeros(4, dtype=mask.dtype))
    assert not dropped.hidden_states[1].any() and not dropped.pooled[1].any()
    assert torch.equal(dropped.hidden_states[0], stacked.hidden_states[0])


def test_rows_of_different_lengths_stack_padded_with_masked_zeros():
    """An edit model's cached instructions are as long as their pictures and words: stacked, the shorter ones are
    padded and masked; rows of different lengths without a mask are refused."""
    long = {"hidden_states": torch.ones(5, 2), "attention_mask": torch.ones(5, dtype=torch.long)}
    short = {"hidden_states": torch.full((3, 2), 2.0), "attention_mask": torch.ones(3, dtype=torch.long)}
    stacked = Conditioning.stack([short, long], "cpu")
    assert stacked.hidden_states.shape == (2, 5, 2)
    assert torch.equal(stacked.get("attention_mask")[0], torch.tensor([1, 1, 1, 0, 0]))
    assert torch.equal(stacked.hidden_states[0, 3:], torch.zeros(2, 2)) and bool(
        (stacked.hidden_states[0, :3] == 2).all()
    )
    with pytest.raises(RuntimeError):
        Conditioning.stack([{"hidden_states": torch.ones(5, 2)}, {"hidden_states": torch.ones(3, 2)}], "cpu")


def test_production_code_does_not_import_the_test_models():
    """Training, sampling and the families load without `onetrainer.tiny` (it is imported only for `tiny:` names)."""
    code = (
        "import sys, onetrainer.training.trainer, onetrainer.families.sd, onetrainer.families.sdxl, "
        "onetrainer.cli.sample; print([m for m in sys.modules if m.startswith('onetrainer.tiny')])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


class _RecordingPipeline:
    """A diffusers pipeline's call signature, recording the arguments (an image of one grey pixel)."""

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def set_progress_bar_config(self, **kwargs) -> None:
        pass

    def __call__(self, **kwargs):
        import numpy as np

        self.calls.append(kwargs)
        return type("Output", (), {"images": np.full((1, 1, 1, 3), 0.5)})()


def _model(model_type):
    from onetrainer.config.enums import ModelType
    from onetrainer.families.base import LoadedModel
    from onetrainer.noise.discrete import DiscreteSchedule
    from onetrainer.noise.prediction import PredictionType
    from onetrainer.tiny import reference

    schedule = DiscreteSchedule(reference.DDIM_EPSILON, PredictionType.EPSILON)
    return LoadedModel(ModelType[model_type], {}, [], schedule, "test")


def test_render_pipeline_uses_only_the_calls_the_contract_declares():
    # A family that declares only `pipeline` samples without SD's guidance rescale or inpainting inputs, also with
    # zero terminal SNR; SD's own `pipeline_arguments` add them.
    from onetrainer.config.sample_config import SampleConfig
    from onetrainer.families.base import Family
    from onetrainer.families.sd import StableDiffusionFamily
    from onetrainer.sampling.sampler import render_pipeline

    recording = _RecordingPipeline()
    declared = {name for name in vars(Family) if not name.startswith("_")}
    assert {"pipeline", "prompt_arguments", "pipeline_arguments"} <= declared

    class OnePipeline(StableDiffusionFamily):
        pipeline_arguments = Family.pipeline_arguments  # the contract's default, not SD's

        def pipeline(self, model, sampler):
            return recording

    sample = SampleConfig(prompt="a cat", width=64, height=64)
    render_pipeline(OnePipeline(), _model("STABLE_DIFFUSION_15_INPAINTING"), sample, lambda t: t, True)
    assert "guidance_rescale" not in recording.calls[-1] and "mask_image" not in recording.calls[-1]
    assert recording.calls[-1]["prompt"] == "a cat"

    class Sd(StableDiffusionFamily):
        def pipeline(self, model, sampler):
            return recording

    render_pipeline(Sd(), _model("STABLE_DIFFUSION_15_INPAINTING"), sample, lambda t: t, True)
    assert recording.calls[-1]["guidance_rescale"] == 0.7 and recording.calls[-1]["strength"] == 1.0
    render_pipeline(Sd(), _model("STABLE_DIFFUSION_15"), sample, lambda t: t, False)
    assert "guidance_rescale" not in recording.calls[-1] and "image" not in recording.calls[-1]


def test_part_roles_are_declared_once_by_the_family_info():
    """One vocabulary: the config's PartRole, declared per part in FamilyInfo; a Family reads it from there (on the
    class too, as the preflight does) and may not declare it again. The config's part blocks default by that role."""
    import pytest

    from onetrainer.config import TrainConfig
    from onetrainer.config import model_types as mt
    from onetrainer.families import FAMILY_CLASSES, base, load_family_class

    assert base.PartRole is mt.PartRole
    for info in mt.FAMILIES.values():
        assert next(iter(info.part_roles.values())) is mt.PartRole.DENOISER and info.parts == tuple(info.part_roles)
        if info.key in FAMILY_CLASSES:
            model_type = next(t for t, i in mt.MODEL_TYPES.items() if i.family is info)
            family_class = load_family_class(model_type)
            assert family_class.part_roles is info.part_roles and family_class().part_roles is info.part_roles
    with pytest.raises(TypeError, match=r"FamilyInfo\.part_roles"):

        class Twice(base.Family):
            part_roles: ClassVar = {"unet": mt.PartRole.DENOISER}

    with pytest.raises(ValueError, match="DENOISER"):
        mt.FamilyInfo("x", "X", {"vae": mt.PartRole.IMAGE_ENCODER}, 8, (), {})
    config = TrainConfig()
    assert [config.part(p).train for p in ("vae", "effnet_encoder", "decoder", "decoder_vqgan")] == [False] * 4
    assert (
        config.text_encoder_2.stop_training_after == 30
        and config.prior.train
        and config.prior.stop_training_after is None
    )
    assert mt.part_label("text_encoder_2") == "Text Encoder 2" and mt.part_label("decoder_vqgan") == "Decoder VQGAN"
    assert mt.part_role("vae") is mt.PartRole.IMAGE_ENCODER and mt.part_role("decoder") is mt.PartRole.SAMPLING


# -- the declaration and the class agree ------------------------------------------------------------------------------


def _family_class(key: str) -> type:
    import importlib

    from onetrainer.families import FAMILY_CLASSES

    module, _, name = FAMILY_CLASSES[key].partition(":")
    return getattr(importlib.import_module(module), name)


@pytest.mark.parametrize("key", list(BUILT_IN_FAMILIES))
def test_each_familys_declaration_and_class_agree(key):
    """Formats ↔ writers, offloadable parts ↔ layer blocks, COMFY_LORA ↔ ComfyUI prefixes, reference images ↔ the
    calls that encode them, and every part a fact names is one the family has (`contract.declaration_problems`)."""
    from onetrainer.config.model_types import FAMILIES
    from tests.families.contract import declaration_problems

    assert declaration_problems(FAMILIES[key], _family_class(key)) == []


def _tiny_model_of(key: str) -> tuple[str, str]:
    from onetrainer.config.enums import ModelType
    from onetrainer.config.model_types import family_of
    from tests.helpers import TINY_MODELS

    return next((t, v) for t, v in TINY_MODELS.items() if family_of(ModelType[t]).key == key)


@pytest.mark.parametrize("key", list(BUILT_IN_FAMILIES))
def test_each_family_loads_what_it_declares(key):
    """The loaded tiny model (the real topology) has the declared parts in order, a list of modules at every layer
    block path, a text-encoder slot per declared text encoder with LoRA blocks in it, the schedule its capabilities
    assume, and layers for each layer preset (`contract.loaded_problems`)."""
    from tests.families.contract import loaded_problems
    from tests.helpers import loaded_model

    model_type, variant = _tiny_model_of(key)
    data = {"model_type": model_type, "base_model_name": f"tiny:{variant}", "training_method": "EMBEDDING"}
    family, model = loaded_model({**data, "output_model_format": "SAFETENSORS"})
    assert loaded_problems(family, model) == []


def test_the_contract_checks_can_fail():
    """A writer table that misses a format, a block list for a part without layer offloading and a writer that an
    override bypasses are each found."""
    import dataclasses

    from onetrainer.config.enums import ModelFormat, TrainingMethod
    from onetrainer.families.pixart import PixArtFamily
    from onetrainer.families.pixart_info import PIXART
    from tests.families.contract import declaration_problems

    class Missing(PixArtFamily):
        writers: ClassVar = {ModelFormat.DIFFUSERS: PixArtFamily.save_diffusers}
        layer_blocks: ClassVar = {**PixArtFamily.layer_blocks, "vae": ("decoder.up_blocks",)}

        def save_diffusers(self, model, destination, dtype, metadata=None):
            pass

    problems = declaration_problems(PIXART, Missing)
    assert any("fine-tune formats" in p for p in problems) and any("layer offloading" in p for p in problems)
    assert any("is not the class's own save_diffusers" in p for p in problems)
    fewer = dataclasses.replace(PIXART, output_formats={**PIXART.output_formats, TrainingMethod.FINE_TUNE: ()})
    assert any("not the registered" in p for p in declaration_problems(fewer, PixArtFamily))


def test_each_released_model_declares_every_part_of_its_family():
    """What the estimate counts a hub model not yet downloaded as (`ModelTypeInfo.released_parts`, the family's
    declaration) has one config per part the family loads, a variant only parts of it; a type without one is refused
    by name."""
    from onetrainer.config.model_types import MODEL_TYPES
    from onetrainer.families.meta_models import is_model_config, released_parts

    declared = [info for info in MODEL_TYPES.values() if info.released_parts]
    assert len(declared) >= 20
    for info in declared:
        assert set(info.released_parts) == set(info.family.parts), info.model_type
        assert all(is_model_config(config) for config in info.released_parts.values()), info.model_type
        assert all(set(parts) <= set(info.family.parts) for _, parts in info.released_variants), info.model_type
    medium = released_parts("STABLE_DIFFUSION_35", "stabilityai/stable-diffusion-3.5-medium")["transformer"]
    assert medium != released_parts("STABLE_DIFFUSION_35")["transformer"]
    with pytest.raises(ValueError, match="no reference model for PIXART_SIGMA"):
        released_parts("PIXART_SIGMA")
