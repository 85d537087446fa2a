"""A family's own state on its loaded model is typed (`base.FamilyState`, `LoadedModel.family_state`): each family
declares its fields with their defaults in one class, an undeclared field cannot be set, and another family's state
is refused."""

from __future__ import annotations

import dataclasses
import importlib

import pytest
import torch

from onetrainer.config.enums import ModelType
from onetrainer.families.base import FamilyState, LoadedModel
from onetrainer.families.registry import BUILT_IN_FAMILIES


def _model(state: FamilyState | None = None) -> LoadedModel:
    from onetrainer.noise.discrete import DiscreteSchedule
    from onetrainer.noise.prediction import PredictionType
    from onetrainer.tiny import reference

    schedule = DiscreteSchedule(reference.DDIM_EPSILON, PredictionType.EPSILON)
    return LoadedModel(ModelType.FLUX_DEV_1, {}, [], schedule, "test", state)


def _state_classes() -> set[type[FamilyState]]:
    """The state classes the built-in family modules declare (read from the modules: a slotted dataclass replaces the
    class it was made from, which `__subclasses__` would still list)."""
    found = set()
    for target in BUILT_IN_FAMILIES.values():
        module = importlib.import_module(target.partition(":")[0])
        found |= {v for v in vars(module).values() if isinstance(v, type) and issubclass(v, FamilyState)}
    return found - {FamilyState}


def test_every_built_in_state_has_its_defaults_in_its_class_and_no_other_field() -> None:
    from onetrainer.families.flux import FluxState
    from onetrainer.families.pixart import PixArtState

    classes = _state_classes()
    assert FluxState in classes and PixArtState in classes
    for cls in classes:
        state = cls()  # every field has its default where the class declares it
        assert dataclasses.is_dataclass(state)
        with pytest.raises(AttributeError):
            state.no_such_field = 1  # slotted: a misspelt name is an error, not a new key
        with pytest.raises(TypeError):
            cls(no_such_field=1)


def test_a_model_without_state_gets_the_family_defaults_and_keeps_them() -> None:
    from onetrainer.families.flux import FluxState

    model = _model()
    state = model.family_state(FluxState)
    assert (state.train_steps, state.guidance, state.mask_padding) == (1000, 1.0, False)
    state.guidance = 3.5
    assert model.family_state(FluxState).guidance == 3.5


def test_another_familys_state_is_refused() -> None:
    from onetrainer.families.flux import FluxState
    from onetrainer.families.pixart import PixArtState

    model = _model(PixArtState(tokens=300))
    assert model.family_state(PixArtState).tokens == 300
    with pytest.raises(TypeError, match="PixArtState, not FluxState"):
        model.family_state(FluxState)


def test_flux_reads_its_guidance_and_schedule_length_from_its_state() -> None:
    from onetrainer.families.base import Conditioning
    from onetrainer.families.flux import FluxFamily, FluxState

    model = _model(FluxState(train_steps=500, guidance=2.5, mask_padding=True))
    model.parts["transformer"] = torch.nn.Linear(1, 1)
    model.parts["transformer"].config = type("Config", (), {"guidance_embeds": True})()
    hidden = torch.ones(2, 3, 4)
    conditioning = Conditioning({"hidden_states": hidden, "attention_mask": torch.tensor([[1, 1, 0], [1, 0, 0]])})
    inputs = FluxFamily().transformer_inputs(model, conditioning, {}, 2, 16)
    assert torch.equal(inputs["guidance"], torch.full((2,), 2.5))
    assert inputs["encoder_hidden_states"][0, 2].abs().sum() == 0  # mask_padding: the padding's states are zeroed
