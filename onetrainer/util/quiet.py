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
