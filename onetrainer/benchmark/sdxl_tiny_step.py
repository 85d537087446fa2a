"""The tiny models of this family whose denoiser step `scripts/benchmark.py --part tiny` times:
SDXL's UNet, with its second text encoder's pooled and size conditions."""

VARIANTS = ("sdxl",)
