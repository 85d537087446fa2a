"""The tiny models of this family whose denoiser step `scripts/benchmark.py --part tiny` times:
Stable Cascade's prior (stage C at the real depth)."""

VARIANTS = ("cascade",)
