"""The tiny models of this family whose denoiser step `scripts/benchmark.py --part tiny` times:
Würstchen's prior."""

VARIANTS = ("wuerstchen",)
