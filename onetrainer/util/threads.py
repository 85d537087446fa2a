"""Model classes named in configs, looked up safely from any thread.

The app computes its estimate on a worker thread (which may build a `tiny:` model or a full-size one on the meta
device) while the window's thread and Start's trainer thread import transformers and diffusers too. importlib breaks a
cross-thread import cycle by handing one thread a half-initialised module; a module object bound by
`import transformers` in that thread then never gets the lazy attributes ("module 'transformers' has no attribute
'T5EncoderModel'").
"""

from __future__ import annotations

import importlib
from typing import Any


def library_attribute(library: str, name: str) -> Any:
    """`getattr(<library>, name)` on the library as it is imported now (`sys.modules`), for transformers' and
    diffusers' lazy attributes (classes named in configs), never on a module object bound at import time."""
    return getattr(importlib.import_module(library), name)
