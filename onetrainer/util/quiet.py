"""Silence library chatter (download bars, import notices) that would drown the trainer's own output."""

from __future__ import annotations

import logging
import os
import warnings


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


# bitsandbytes' CPU backend logs this at import when it cannot load its hub kernel (a faster 4-bit CPU matmul) through
# the `kernels` package: always here, as `no_hub_kernels.py` keeps it from asking the hub. bitsandbytes is imported by
# diffusers' quantizers on any model import, so the line opened every log and `--preflight` and read like a missing
# install step; nothing here uses that kernel.
_BNB_CPU_LOGGER = "bitsandbytes.backends.cpu.ops"
_BNB_KERNELS_NOTICE = "Failed to load CPU gemm_4bit_forward from kernels-community"


class _DropMissingKernelsNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not (str(record.msg).startswith(_BNB_KERNELS_NOTICE) and "kernels" in record.getMessage())


def silence_harmless_notices() -> None:
    """Filter out the import-time notices that are known to be harmless (only those; the loggers stay as they are).
    Called when `onetrainer` is imported, before any library that imports bitsandbytes."""
    logger = logging.getLogger(_BNB_CPU_LOGGER)
    if not any(isinstance(f, _DropMissingKernelsNotice) for f in logger.filters):
        logger.addFilter(_DropMissingKernelsNotice())
