"""The tiny model variants, by name, gathered from the families' tiny modules.

Each family brings its tiny models in a module of its own here. A tiny module is torch-free at import (it imports
torch, diffusers and transformers inside its functions), so that listing the variants stays cheap, and it offers:

- `VARIANTS`: its `TinyVariant`s, in the order they are listed, and `build_pipeline(variant, seed)`, which builds one
  (the same seed, the same weights);
- `LISTING_ORDER` (optional): where its variants stand among the built-in ones in the listings (the `tiny:` names a
  user is offered): the order the tiny models were added in, which the listings kept before the families brought their
  own and which the family registry's order is not; without one they follow those, in the family registry's order;
- `DENOISER_INPUTS` (optional): {denoiser class name: `inputs(model, randn)`}, the made-up batch of the tiny step
  (`denoiser_step.py`);
- `MODEL_INDEX_ENTRIES`, `store_extras(pipeline, folder, variant)`, `save_pipeline(pipeline, folder)` (optional):
  how its folders differ from what diffusers writes (`storage.py`);
- `build_own_part(variant, part)`: the parts its bases bring themselves (`TinyVariant.own_parts`, `source.py`);
- `WIDTH_FIELDS`, `DEPTH_FIELDS` (optional, {component kind: field names}) and `NESTED_CONFIGS`: what its tiny
  configs may change beyond the shared components' widths (`reference.width_fields`).

The built-in tiny modules are named like a built-in family's module or key (`families/registry.py`); a family from
elsewhere registers its own at runtime (`register_tiny_module`), with no shared file edited.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
from collections.abc import Callable
from types import ModuleType

from onetrainer.families.registry import BUILT_IN_FAMILIES
from onetrainer.tiny.variant import DEFAULT_RESOLUTION, TinyVariant

__all__ = [
    "DEFAULT_RESOLUTION",
    "TINY_VARIANTS",
    "TinyVariant",
    "register_tiny_module",
    "tiny_modules",
]


def _built_in_modules() -> list[str]:
    """The tiny modules of the built-in families: `tiny/<family module>.py` or `tiny/<family key>.py` where there is
    one, in their listing order."""
    names: list[str] = []
    for key, target in BUILT_IN_FAMILIES.items():
        for stem in (target.partition(":")[0].rpartition(".")[2], key):
            name = f"{__package__}.{stem}"
            if name not in names and importlib.util.find_spec(name) is not None:
                names.append(name)
    return sorted(names, key=lambda name: getattr(importlib.import_module(name), "LISTING_ORDER", math.inf))


_MODULES: list[str] = _built_in_modules()  # and those registered at runtime, after them
TINY_VARIANTS: dict[str, TinyVariant] = {v.name: v for name in _MODULES for v in importlib.import_module(name).VARIANTS}


def register_tiny_module(name: str) -> Callable[[], None]:
    """Make the tiny models of the module `name` (a tiny module, see above) known, after the built-in ones. Returns
    the undo."""
    module = importlib.import_module(name)
    taken = [v.name for v in module.VARIANTS if v.name in TINY_VARIANTS]
    if name in _MODULES or taken:
        raise ValueError(f"{name}: tiny models already known: {', '.join(taken) or name}")
    _MODULES.append(name)
    TINY_VARIANTS.update((v.name, v) for v in module.VARIANTS)

    def undo() -> None:
        if name in _MODULES:
            _MODULES.remove(name)
        for variant in module.VARIANTS:
            TINY_VARIANTS.pop(variant.name, None)

    return undo


def tiny_modules() -> tuple[ModuleType, ...]:
    """The tiny modules now, built-in and registered, in listing order."""
    return tuple(importlib.import_module(name) for name in _MODULES)
