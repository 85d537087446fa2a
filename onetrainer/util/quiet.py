"""Silence library chatter (download bars, import notices) that would drown the trainer's own output."""

from __future__ import annotations

import contextlib
import logging
import os
import warnings
from collections.abc import Iterator


def quiet_libraries() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        import diffusers.utils.logging as diffusers_logging

        diffusers_logging.set_verbosity_error()
        diffusers_logging.disable_progress_bar()
    except ImportError:
        pass
    try:
        import transformers.utils.logging as transformers_logging

        transformers_logging.set_verbosity_error()
        transformers_logging.disable_progress_bar()
    except ImportError:
        pass
    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message=".*torchvision.*")


# Notices that libraries log where nothing is wrong, by the logger that logs them: each is dropped by a fragment of its
# text, so that every other record of those loggers still shows.
_HARMLESS_NOTICES = {
    # bitsandbytes' CPU backend, at import when it cannot load its hub kernel (a faster 4-bit CPU matmul) through the
    # `kernels` package: always here, as `no_hub_kernels.py` keeps it from asking the hub. bitsandbytes is imported by
    # diffusers' quantizers on any model import, so the line opened every log and `--preflight` and read like a missing
    # install step; nothing here uses that kernel.
    "bitsandbytes.backends.cpu.ops": ("Failed to load CPU gemm_4bit_forward from kernels-community",),
    # transformers without torchvision (which is not installed on purpose: nothing here needs it) falls back to the PIL
    # image processors that diffusers' pipelines name, and says so once per processor on the first model import.
    "transformers.utils.import_utils": ("requires torchvision (not installed); falling back to",),
    # diffusers warns at every `model.to(dtype)` of a model that keeps *no* layer in float32 (its list is empty: the
    # check takes `[]` for a list); a model that does keep some still warns.
    "diffusers.models.modeling_utils": ("that should be kept in float32: []",),
}


class _DropHarmlessNotices(logging.Filter):
    def __init__(self, fragments: tuple[str, ...]) -> None:
        super().__init__()
        self.fragments = fragments

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(fragment in message for fragment in self.fragments)


def silence_harmless_notices() -> None:
    """Filter out the notices that are known to be harmless (only those; the loggers stay as they are). Called when
    `onetrainer` is imported, before any library that logs them is."""
    for name, fragments in _HARMLESS_NOTICES.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropHarmlessNotices) for f in logger.filters):
            logger.addFilter(_DropHarmlessNotices(fragments))


@contextlib.contextmanager
def no_progress_bars() -> Iterator[None]:
    """transformers' and diffusers' progress bars off inside the block, as they were after it: saving a pipeline draws
    a "Writing model shards" bar per text encoder, which in the terminal reads as if the user's model were written
    (the tiny models are built this way on first use, from the checks, the estimate or the run)."""
    import diffusers.utils.logging as diffusers_logging
    import transformers.utils.logging as transformers_logging

    before = [(module, module.is_progress_bar_enabled()) for module in (diffusers_logging, transformers_logging)]
    for module, _ in before:
        module.disable_progress_bar()
    try:
        yield
    finally:
        for module, enabled in before:
            if enabled:
                module.enable_progress_bar()
