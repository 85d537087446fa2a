"""The template family's tiny model (`tiny:tiny-dit`), as a built-in family's is its tiny module
(`onetrainer/tiny/<family>.py`; `onetrainer/tiny/registry.py` lists what such a module offers): its variant, how to
build and store it, and the inputs of its denoiser's tiny step. `register` makes it known at test time, with no shared
file edited.

Its model is no diffusers pipeline: the parts by name, stored as one safetensors file of `<part>.<weight name>`
tensors, which the family's `load` reads from the folder.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from onetrainer.tiny.registry import register_tiny_module
from onetrainer.tiny.variant import TinyVariant
from tests.families.tiny_dit_family import MODEL_TYPE, PATCH, TOKENS, WEIGHTS_FILE, WIDTH, build_parts

NAME = "tiny-dit"

VARIANTS = (
    TinyVariant(
        name=NAME,
        model_type=MODEL_TYPE,
        pipeline_class="",  # not a diffusers pipeline: `save_pipeline` writes its folder
        description="The template family's DiT (2 blocks of 32), a masked T5 (2 layers) and an 8x patch autoencoder",
        module=__name__,
        references={},
    ),
)


def register() -> Callable[[], None]:
    """Make `tiny:tiny-dit` known. Returns the undo."""
    return register_tiny_module(__name__)


def build_pipeline(variant: TinyVariant, seed: int) -> dict[str, Any]:
    return build_parts(seed)[0]


def save_pipeline(parts: dict[str, Any], folder: Path) -> None:
    from safetensors.torch import save_file

    state = {
        f"{name}.{k}": v.detach().clone() for name, module in parts.items() for k, v in module.state_dict().items()
    }
    save_file(state, str(folder / WEIGHTS_FILE))


def dit_inputs(model: Any, randn: Any) -> dict[str, Any]:
    """8x8 latents (64 px), the text's tokens with the second caption's last 5 masked."""
    import torch

    from onetrainer.tiny.denoiser_step import TIME_FRACTIONS

    mask = torch.ones(2, TOKENS)
    mask[1, TOKENS - 5 :] = 0
    side = 4 * PATCH
    return {
        "x": randn(2, model.channels, side, side),
        "t": torch.tensor(TIME_FRACTIONS),
        "text": randn(2, TOKENS, WIDTH),
        "mask": mask,
    }


DENOISER_INPUTS = {"TinyDiT": dit_inputs}
