"""The tiny models of this family whose denoiser step `scripts/benchmark.py --part tiny` times:
PixArt-Alpha's transformer, with the T5 mask and micro-conditions."""

VARIANTS = ("pixart",)
