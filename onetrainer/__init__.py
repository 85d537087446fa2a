"""onetrainer: a trainer for diffusion image models (core library; never imports the GUI)."""

__version__ = "0.1.0"
