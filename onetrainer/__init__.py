"""onetrainer: a trainer for diffusion image models (core library; never imports the GUI)."""

__version__ = "0.1.0"

from onetrainer.util.no_hub_kernels import keep_bitsandbytes_off_the_hub as _keep_bitsandbytes_off_the_hub
from onetrainer.util.quiet import silence_harmless_notices as _silence_harmless_notices

# Before diffusers imports bitsandbytes, whose CPU backend asks the hub for a kernel and logs a harmless notice.
_keep_bitsandbytes_off_the_hub()
_silence_harmless_notices()
