"""The model-type table: every model type with its family's facts, read from the families' own declarations.

Each family declares its facts once, in a torch-free module beside its own (`onetrainer/families/<module>_info.py`,
written in `config/family_info.py`'s vocabulary, which this module re-exports); the built-in ones are gathered here
from the import paths of the family registry (`families/registry.py`, which imports nothing), and a family from
elsewhere adds its model types at runtime (`register_model_type`). The config, the GUI and the families look the facts
up here, without torch.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Iterator, Sequence

from onetrainer.config.enums import ModelType

# The vocabulary, re-exported: the rest of the code reads it here with the table.
from onetrainer.config.family_info import (  # noqa: F401
    ALL_METHODS,
    CAPABILITIES,
    CIRCULAR_PADDING,
    FLOW_MATCHING,
    GENERALIZED_OFFSET_NOISE,
    GGUF_FILE,
    GUIDANCE_INPUT,
    LAYER_OFFLOADING,
    LAYER_SKIP,
    LEARNED_VARIANCE,
    OPTIONAL_PART,
    OWN_MODEL,
    REFERENCE_IMAGES,
    SEQUENCE_LENGTH,
    SKIP_LAYER_GUIDANCE,
    TEXT_PADDING_MASK,
    ZERO_TERMINAL_SNR,
    FamilyInfo,
    FileCaveat,
    ModelTypeInfo,
    PartRole,
    SampleDefaults,
    default_part_label,
)

# Filled from the declarations when this module is first imported (`_read_declarations`, at its end), and by
# `register_model_type`.
MODEL_TYPES: dict[ModelType, ModelTypeInfo] = {}
FAMILIES: dict[str, FamilyInfo] = {}


class _SupportedModelTypes(Sequence[ModelType]):
    """The keys of `MODEL_TYPES`, read live: the `model_type` setting's choices follow `register_model_type`."""

    def __getitem__(self, index):  # type: ignore[override]
        return tuple(MODEL_TYPES)[index]

    def __len__(self) -> int:
        return len(MODEL_TYPES)

    def __iter__(self) -> Iterator[ModelType]:
        return iter(tuple(MODEL_TYPES))

    def __contains__(self, value: object) -> bool:
        return value in MODEL_TYPES


SUPPORTED_MODEL_TYPES: Sequence[ModelType] = _SupportedModelTypes()


def model_type_info(model_type: ModelType) -> ModelTypeInfo:
    try:
        return MODEL_TYPES[model_type]
    except KeyError:
        raise ValueError(f"model type {model_type.value} is not supported by this trainer") from None


def family_of(model_type: ModelType) -> FamilyInfo:
    return model_type_info(model_type).family


def left_out(config, part: str) -> bool:
    """Whether the config leaves `part` out (`include` false on a part its family can do without): never loaded."""
    family = family_of(config.model_type)
    return not config.part(part).include and OPTIONAL_PART in family.part_capabilities.get(part, ())


def declared_part_roles(families: Iterable[FamilyInfo] | None = None) -> dict[str, PartRole]:
    """Every part name the families declare, with its role: OneTrainer's part blocks of the config (their defaults,
    the GUI and docs listing). Ordered by role, then by first declaration. A name must have one role in every family,
    since one config block serves them all."""
    found: dict[str, PartRole] = {}
    for family in FAMILIES.values() if families is None else families:
        for part, role in family.part_roles.items():
            if found.setdefault(part, role) is not role:
                raise ValueError(f"part {part} is a {found[part].name} in one family and a {role.name} in {family.key}")
    order = list(PartRole)
    return dict(sorted(found.items(), key=lambda item: order.index(item[1])))


def part_role(part: str) -> PartRole:
    """The role the families declare for a part name (the same in every family that has it)."""
    return declared_part_roles()[part]


def part_label(part: str) -> str:
    """The label of a part name in every family: the one the families that have it declare alike, else (none
    declares one, or they differ, as Wan 2.2's high-noise `transformer` from the others') the one derived from the
    name. A family's own label is its `FamilyInfo.part_label`."""
    labels = {f.part_label(part) for f in FAMILIES.values() if part in f.part_roles}
    return labels.pop() if len(labels) == 1 else default_part_label(part)


def all_parts() -> tuple[str, ...]:
    """Every part name of any family (the config's part blocks)."""
    return tuple(declared_part_roles())


# ---------------------------------------------------------------------------------------------------------------------
# Registering at runtime: a family outside the registry declares its model types here (the call returns its undo, for
# tests). Its parts come with its `FamilyInfo`: a part name no TrainConfig field has gets its settings in
# `TrainConfig.parts`.


def register_model_type(info: ModelTypeInfo) -> Callable[[], None]:
    """Declare a model type (and its family's facts) at runtime, as if a declaration module of the registry held it.

    The member comes from `ModelType`, OneTrainer's list of names. A part name it shares with another family must
    have the same role there, since one config block serves both.
    """
    declared_part_roles([*FAMILIES.values(), info.family])  # raises on a part name with two roles
    family = FAMILIES.get(info.family.key)
    if family is not None and family is not info.family:
        raise ValueError(f"{info.label}: the family key {info.family.key!r} is already declared by {family.label}")
    previous = MODEL_TYPES.get(info.model_type)
    MODEL_TYPES[info.model_type] = info
    FAMILIES[info.family.key] = info.family

    def undo() -> None:
        if previous is None:
            MODEL_TYPES.pop(info.model_type, None)
        else:
            MODEL_TYPES[info.model_type] = previous
        if family is None and all(i.family is not info.family for i in MODEL_TYPES.values()):
            FAMILIES.pop(info.family.key, None)

    return undo


def _read_declarations() -> None:
    """The built-in families' model types, in the registry's order (the menu's, the part blocks'), from each family
    module's declaration. Imported by path, at the end of this module: the declarations are written in the
    vocabulary above and the registry imports nothing, so neither reads this table while it fills."""
    from onetrainer.families.registry import declaration_modules

    for name in declaration_modules():
        for info in importlib.import_module(name).MODEL_TYPES:
            if info.model_type in MODEL_TYPES:
                raise ValueError(
                    f"{name}: {info.model_type.name} is already declared by {MODEL_TYPES[info.model_type].family.key}"
                )
            family = FAMILIES.get(info.family.key)
            if family is not None and family is not info.family:
                raise ValueError(f"{name}: the family key {info.family.key!r} is already declared by {family.label}")
            MODEL_TYPES[info.model_type] = info
            FAMILIES[info.family.key] = info.family
    declared_part_roles()  # raises on a part name with two roles


_read_declarations()
