"""Model classes named in configs, looked up safely from any thread.

The app computes its estimate on a worker thread (which may build a `tiny:` model or a full-size one on the meta
device) while the window's thread and Start's trainer thread import transformers and diffusers too. importlib breaks a
cross-thread import cycle by handing one thread a half-initialised module; a module object bound by
`import transformers` in that thread then never gets the lazy attributes ("module 'transformers' has no attribute
'T5EncoderModel'").
"""

from __future__ import annotations

import importlib
import threading
from typing import Any

# Held by whatever imports and builds models with transformers and diffusers while another thread may do the same: the
# estimate's measurement (the app's worker thread), a tiny model's build and a family's load (a run's or the sampling
# window's thread). importlib gives one of two threads that import interdependent modules at once a half-initialised
# module ("partially initialized module 'accelerate.big_modeling'"), so these take turns; re-entrant, because a load
# may build a tiny model. The steps of a run do not take it.
MODEL_LIBRARY_LOCK = threading.RLock()


def library_attribute(library: str, name: str) -> Any:
    """`getattr(<library>, name)` on the library as it is imported now (`sys.modules`), for transformers' and
    diffusers' lazy attributes (classes named in configs), never on a module object bound at import time."""
    return getattr(importlib.import_module(library), name)
