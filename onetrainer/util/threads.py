"""One lock for building and loading models from several threads of one process.

The app computes its estimate on a worker thread (which may build a `tiny:` model or a full-size one on the meta
device) while Start loads the model on the trainer thread. Both import transformers' and diffusers' model modules on
first use, and importlib breaks a cross-thread import cycle by handing one thread a half-initialised module, which
transformers' lazy attributes then report as missing ("module 'transformers' has no attribute 'T5EncoderModel'").
Whoever builds or loads a model holds this lock, so the first imports happen on one thread at a time.
"""

from __future__ import annotations

import importlib
import threading
from typing import Any

MODEL_BUILD_LOCK = threading.RLock()


def library_attribute(library: str, name: str) -> Any:
    """`getattr(<library>, name)` on the library as it is imported now (`sys.modules`), for transformers' and
    diffusers' lazy attributes (classes named in configs). A module object bound by `import transformers` is not
    enough: a thread whose import met another thread's import of the same library (importlib breaks the cycle) keeps
    the half-initialised module, on which those attributes never appear."""
    return getattr(importlib.import_module(library), name)
