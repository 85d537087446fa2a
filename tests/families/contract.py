"""The pairs a family declares in two places, which must agree: its declaration (`FamilyInfo`, torch-free, read by the
config and the GUI) and its class (what the trainer calls). The contract tests run these over every registered family,
the test's own template family included (`tiny_dit_family.py`).

`declaration_problems` reads the declarations only; `loaded_problems` looks at a loaded model too (its parts, blocks,
text encoders, schedule and layer presets).
"""

from __future__ import annotations

import inspect

import torch

from onetrainer.config.enums import ModelFormat, TrainingMethod
from onetrainer.config.model_types import (
    CAPABILITIES,
    FLOW_MATCHING,
    GENERALIZED_OFFSET_NOISE,
    LAYER_OFFLOADING,
    LEARNED_VARIANCE,
    OPTIONAL_PART,
    REFERENCE_IMAGES,
    ZERO_TERMINAL_SNR,
    FamilyInfo,
    PartRole,
)
from onetrainer.families.base import Family, LoadedModel

# Capabilities that only a discrete (DDPM) schedule can honour: its β table (zero terminal SNR, the VB term of learned
# variance) and its integer timesteps (generalized offset noise).
DISCRETE_SCHEDULE_CAPABILITIES = frozenset({ZERO_TERMINAL_SNR, GENERALIZED_OFFSET_NOISE, LEARNED_VARIANCE})


def _overrides(family_class: type[Family], name: str) -> bool:
    return inspect.getattr_static(family_class, name) is not inspect.getattr_static(Family, name)


def declaration_problems(info: FamilyInfo, family_class: type[Family]) -> list[str]:
    """What the declaration and the class say differently, from the declarations alone ([] when they agree)."""
    from onetrainer.config.train_config import LAYER_FILTER_PRESETS

    problems: list[str] = []
    parts = set(info.parts)
    if family_class.info is not info:
        problems.append(f"the class's info is {family_class.info.key!r}, not the registered {info.key!r}")

    # Formats ↔ writers: every fine-tune format the GUI offers has a writer, and no writer waits for a format the
    # declaration does not offer; each writer is the method the class has under its name (an override of a writer
    # would otherwise be bypassed).
    formats = set(info.output_formats.get(TrainingMethod.FINE_TUNE, ()))
    writers = family_class.writers
    if TrainingMethod.FINE_TUNE in info.methods and formats != set(writers):
        problems.append(
            f"fine-tune formats {sorted(f.name for f in formats)} but writers {sorted(f.name for f in writers)}"
        )
    for fmt, writer in writers.items():
        if not callable(writer) or getattr(family_class, writer.__name__, None) is not writer:
            problems.append(f"the writer of {fmt.name}, {writer!r}, is not the class's own {writer.__name__}")

    # Offloadable parts ↔ layer blocks (`training/placement.py` indexes the blocks by the parts that declare it).
    offloaded = {p for p, caps in info.part_capabilities.items() if LAYER_OFFLOADING in caps}
    if offloaded != set(family_class.layer_blocks):
        problems.append(
            f"parts with layer offloading {sorted(offloaded)}, layer blocks of {sorted(family_class.layer_blocks)}"
        )

    # COMFY_LORA ↔ the parts' ComfyUI prefixes its names are written under.
    comfy = ModelFormat.COMFY_LORA in info.output_formats.get(TrainingMethod.LORA, ())
    if comfy != bool(family_class.comfy_prefixes) or not set(family_class.comfy_prefixes) <= parts:
        problems.append(f"COMFY_LORA offered: {comfy}, ComfyUI prefixes for {sorted(family_class.comfy_prefixes)}")

    # Reference images: the flag and the calls that encode them say the same, and training on them gives samples them
    # (the capability); samples alone may take them (an image-to-video model's start image, its training clips' first
    # frames).
    encodes = _overrides(family_class, "encode_references") and _overrides(family_class, "typical_references")
    if info.reference_images != encodes or (info.reference_images and REFERENCE_IMAGES not in info.capabilities):
        problems.append(
            f"reference_images {info.reference_images}, capability {REFERENCE_IMAGES in info.capabilities}, "
            f"encode_references and typical_references overridden: {encodes}"
        )

    # The text encoder reads the references (the text cache keys captions with them) ↔ `encode_text` takes them.
    reads = "references" in inspect.signature(family_class.encode_text).parameters
    if info.text_reads_references != reads or (reads and not info.reference_images):
        problems.append(
            f"text_reads_references {info.text_reads_references}, encode_text takes references: {reads}, "
            f"reference_images {info.reference_images}"
        )

    # Every fact about a part names a part the family has; every capability is one the settings know.
    named = {
        "sampling_parts": set(family_class.sampling_parts),
        "hub_parts": set(info.hub_parts),
        "float16_unsafe_parts": set(info.float16_unsafe_parts),
        "part_capabilities": set(info.part_capabilities),
        "part_hub_file_sets": set(info.part_hub_file_sets),
        "part_downloads": set(info.part_downloads),
        "file_caveats": {c.part for c in info.file_caveats if c.part is not None},
    }
    problems += [f"{what} names parts it does not have: {sorted(n - parts)}" for what, n in named.items() if n - parts]
    if unknown := set(info.capabilities) - CAPABILITIES:
        problems.append(f"unknown capabilities {sorted(unknown)}")
    optional = {p for p, caps in info.part_capabilities.items() if OPTIONAL_PART in caps}
    if any(info.part_roles[p] is PartRole.DENOISER for p in optional):
        problems.append("the denoiser cannot be an optional part")
    for caveat in info.file_caveats:
        if caveat.format not in info.output_formats.get(caveat.method, ()):
            problems.append(f"a caveat about {caveat.format.name}, which {caveat.method.name} does not write")
    if unknown := set(info.layer_presets) - set(LAYER_FILTER_PRESETS):
        problems.append(f"layer presets the config does not offer: {sorted(unknown)}")
    if set(info.output_formats) - set(info.methods):
        problems.append(f"formats for methods it does not train: {sorted(m.name for m in info.output_formats)}")
    return problems


def loaded_problems(family: Family, model: LoadedModel) -> list[str]:
    """What a loaded model of the family says against its declaration ([] when they agree): its parts, the blocks
    layer offloading moves, the text encoders' LoRA blocks, the schedule the capabilities assume, the layer presets."""
    from onetrainer.noise.discrete import DiscreteSchedule
    from onetrainer.noise.flow_matching import FlowMatchingSchedule
    from onetrainer.util.layer_filter import configured_patterns

    info = family.info
    problems: list[str] = []
    if list(model.parts) != list(info.parts):
        problems.append(f"loaded parts {list(model.parts)}, declared {list(info.parts)}")
    for part, paths in family.layer_blocks.items():
        # A family may name each of its variants' paths (Flux.2's Qwen3 or Mistral3 text encoder): those the loaded
        # part has are lists of modules, and it has at least one.
        present = [p for p in paths if _has_submodule(model.part(part), p)]
        if not present:
            problems.append(f"layer blocks of {part}: none of {list(paths)} in the loaded part")
        for path in present:
            blocks = model.part(part).get_submodule(path)
            if not isinstance(blocks, torch.nn.ModuleList) or len(blocks) == 0:
                problems.append(f"layer blocks {part}.{path} are not a list of modules")
    encoders = [slot.part for slot in model.text_encoders]
    if encoders != list(info.parts_with(PartRole.TEXT_ENCODER)):
        problems.append(
            f"text encoder slots {encoders}, declared text encoders {info.parts_with(PartRole.TEXT_ENCODER)}"
        )
    for part in encoders:
        if not family.lora_targets(model, part, [], False):
            problems.append(f"text_encoder_blocks selects no linear layer of {part}")
    # Muon's default hidden layers (`info.muon_hidden_layers`, substrings of the trained weights' names, the part's
    # name first) must find the denoiser's blocks and each text encoder's layers, or Muon trains nothing there.
    for part in (family.denoiser_part, *encoders):
        names = [f"{part}.{module}.weight" for module in family.lora_targets(model, part, [], False)]
        if not any(pattern in name for name in names for pattern in info.muon_hidden_layers):
            problems.append(f"muon_hidden_layers {list(info.muon_hidden_layers)} match no layer of {part}")
    flow = isinstance(model.schedule, FlowMatchingSchedule)
    if flow != (FLOW_MATCHING in info.capabilities):
        problems.append(f"capability {FLOW_MATCHING}: {not flow}, schedule {type(model.schedule).__name__}")
    if (discrete := DISCRETE_SCHEDULE_CAPABILITIES & info.capabilities) and not isinstance(
        model.schedule, DiscreteSchedule
    ):
        problems.append(f"capabilities {sorted(discrete)} on a {type(model.schedule).__name__}")
    for preset in info.layer_presets:
        patterns, regex = configured_patterns("", preset, False, info.layer_presets)
        if patterns and not family.lora_targets(model, family.denoiser_part, patterns, regex):
            problems.append(f"layer preset {preset!r} selects no layer of the {family.denoiser_part}")
    return problems


def _has_submodule(module: torch.nn.Module, path: str) -> bool:
    try:
        module.get_submodule(path)
    except AttributeError:
        return False
    return True
