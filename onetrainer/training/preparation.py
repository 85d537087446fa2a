"""What the trainer does before the first step besides loading and placing the model: fill the caches, compile the
denoiser."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from onetrainer.data.cache import clear_cache, remove_outdated_entries
from onetrainer.data.caching import fill_latent_cache, fill_text_cache, text_encoders_frozen
from onetrainer.data.training_data import DatasetError
from onetrainer.training.events import CacheFilled, CacheProgress, Status, Warning_
from onetrainer.training.interruptible import checked_in_every_layer

if TYPE_CHECKING:
    import torch

    from onetrainer.config import TrainConfig
    from onetrainer.data.caching import TextCache
    from onetrainer.data.training_data import TrainingData
    from onetrainer.families.base import Family, LoadedModel
    from onetrainer.methods.base import Method
    from onetrainer.training.distributed import Distributed, SingleProcess
    from onetrainer.training.events import Broadcast

Say = Callable[[str], None]


def compile_denoiser(family: Family, model: LoadedModel, device: torch.device, warn: Say, status: Say) -> None:
    """`compile`: the denoiser's blocks compiled one at a time (`memory/compile.py`), else a warning."""
    from onetrainer.memory.compile import compile_blocks, unavailable_reason

    for part in family.denoiser_parts:  # each of several (Wan 2.2's experts)
        paths = family.layer_blocks.get(part)
        if not paths:
            warn(f"compile: {family.info.label}'s {part} declares no blocks to compile; it trains uncompiled")
            continue
        reason = unavailable_reason(device)
        if reason:
            warn(f"compile: {reason}; the {part} trains uncompiled")
            return
        count = compile_blocks(model.part(part), paths)
        status(f"the {part}'s {count} blocks compile on first use (the first steps are slower)")


class CacheFill:
    """The cache passes before training: latents, and the captions' encodings while the text encoders are frozen.

    Each pass reports its progress (the footer's bar, the terminal's) after every entry it writes, and `stopped` is
    asked there and before every layer of the encoders (one batch of a large encoder can take minutes): a stop ends
    caching at once, keeping every entry written so far. Ranks write different entries, so `stopped` is this
    process's own request, with no collective."""

    def __init__(self, events: Broadcast, stopped: Callable[[], None]) -> None:
        self.events = events
        self.stopped = stopped  # raises when a stop was requested
        self.progress: CacheProgress | None = None  # the pass under way (None outside caching)
        self._since = 0.0

    def fill(
        self,
        config: TrainConfig,
        data: TrainingData,
        family: Family,
        model: LoadedModel,
        method: Method,
        with_masks: bool,
        ranks: Distributed | SingleProcess,
    ) -> TextCache | None:
        """Fill the caches; the text cache, or None when the text encoders train (their outputs change every step)."""
        if config.clear_cache_before_training:
            clear_cache(config.cache_dir)
            self._status(f"cleared the cache in {config.cache_dir} ('Clear cache before training' is on)")
        outdated, size = remove_outdated_entries(config.cache_dir)
        if outdated:
            self._status(f"removed {outdated} cache entries of an earlier format ({size / 1024**2:.1f} MiB)")
        with checked_in_every_layer(model.parts.values(), self.stopped):
            stats = fill_latent_cache(data, family, model, config, with_masks, self._report, ranks)
            self.progress = None
            for failure in stats.failed:
                self.events.emit(Warning_(f"{failure}; skipped"))
            if not data.images:
                raise DatasetError("no training image could be decoded")
            rate = f"{stats.per_second:.1f}/s"
            self._status(f"latents: {stats.needed - stats.encoded} cached, {stats.encoded} encoded ({rate})")
            self.events.emit(CacheFilled("latents", stats.needed, stats.encoded, stats.seconds))
            if not text_encoders_frozen(config):
                return None
            text_cache, text_stats = fill_text_cache(
                data, family, model, config, method.embeddings.apply, self._report, ranks
            )
            self.progress = None
            self._status(f"captions: {text_stats.needed - text_stats.encoded} cached, {text_stats.encoded} encoded")
            self.events.emit(CacheFilled("captions", text_stats.needed, text_stats.encoded, text_stats.seconds))
            return text_cache

    def _report(self, kind: str, done: int, total: int) -> None:
        now = time.monotonic()
        if done == 0:
            self._since = now
        self.progress = CacheProgress(kind, done, total, now - self._since)
        self.events.emit(self.progress)
        self.stopped()

    def _status(self, text: str) -> None:
        self.events.emit(Status(text))
