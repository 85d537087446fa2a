"""onetrainer: a trainer for diffusion image models (core library; never imports the GUI)."""

__version__ = "0.1.0"

from onetrainer.util.quiet import silence_harmless_notices as _silence_harmless_notices

_silence_harmless_notices()  # before diffusers imports bitsandbytes, whose CPU backend logs a harmless notice
