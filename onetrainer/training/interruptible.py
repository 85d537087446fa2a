"""Ending a long forward pass when the user stops: a batch of caching's encoders (a VAE over four images, a language
model over a caption and its reference pictures) can take minutes on a small GPU or a CPU, and a stop checked only
between batches waited for all of it. Checked before each submodule runs instead, a stop ends the pass within one
layer's time; what the pass would have written is simply not written."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

import torch


@contextmanager
def checked_in_every_layer(modules: Iterable[torch.nn.Module], check: Callable[[], None]) -> Iterator[None]:
    """Within the block, `check()` runs before every submodule of `modules` computes: it raises to end the pass. The
    hooks come first (before layer offloading's, which would otherwise move a block's weights in for nothing) and are
    removed on leaving, so training's steps never pay for them."""

    def before_forward(_module: torch.nn.Module, _args: tuple) -> None:
        check()

    handles = [
        sub.register_forward_pre_hook(before_forward, prepend=True) for module in modules for sub in module.modules()
    ]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
