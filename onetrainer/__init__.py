"""onetrainer: a trainer for diffusion image models (core library; never imports the GUI)."""

__version__ = "0.1.0"

import os as _os

from onetrainer.util.no_hub_kernels import keep_bitsandbytes_off_the_hub as _keep_bitsandbytes_off_the_hub
from onetrainer.util.quiet import silence_harmless_notices as _silence_harmless_notices

# Before diffusers imports bitsandbytes, whose CPU backend asks the hub for a kernel and logs a harmless notice.
_keep_bitsandbytes_off_the_hub()
_silence_harmless_notices()

# onnxruntime (the mask tool's u2net, the WD14 tagger) writes a device id and a queue of usage telemetry under the
# user's cache on import unless told not to; a desktop trainer sends nothing anywhere unasked. ORT_DISABLE_TELEMETRY=0
# in the environment turns it back on.
_os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
