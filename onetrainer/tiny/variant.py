"""One tiny model: the real model it imitates and the tiny module that builds it (`registry.py` gathers them)."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any

from onetrainer.config.enums import ModelType

if TYPE_CHECKING:
    from onetrainer.families.reference_configs import Config

# Every variant samples at 64 px by default: 8x8 latents, small enough for a CPU and still divisible by every
# UNet's downsampling.
DEFAULT_RESOLUTION = 64


@dataclass(frozen=True)
class TinyVariant:
    """One tiny model: the real model it imitates and how to build it."""

    name: str
    model_type: ModelType
    pipeline_class: str  # the diffusers pipeline class, as in model_index.json
    description: str
    # The tiny module that declares it (`registry.py` lists what such a module offers): its `build_pipeline(variant,
    # seed)` builds it, its hooks store it and feed its denoiser.
    module: str
    # Real (full-size) config of each pipeline component; the tiny ones differ only in width fields.
    references: Mapping[str, Config]
    resolution: int = DEFAULT_RESOLUTION
    # Block counts the tiny model shrinks, by component ({"transformer": {"num_layers": 2}}): only where the real
    # model repeats one block kind dozens of times (the module's `DEPTH_FIELDS`); every other variant keeps the real
    # depth.
    depths: Mapping[str, Config] = field(default_factory=dict)
    # The parts a tiny base model brings itself beside its folder (config part names), which its module's
    # `build_own_part(variant, part)` builds: a real model's part would not fit its widths.
    own_parts: tuple[str, ...] = ()

    @property
    def prediction_type(self) -> str:
        # A scheduler without that setting (Würstchen's) predicts the noise.
        return self.references["scheduler"].get("prediction_type", "epsilon")

    def tiny_module(self) -> ModuleType:
        return importlib.import_module(self.module)

    def build(self, seed: int = 0) -> Any:
        return self.tiny_module().build_pipeline(self, seed)
