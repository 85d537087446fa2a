"""The tiny models of this family whose denoiser step `scripts/benchmark.py --part tiny` times:
SD 1.5 (ε) and SD 2.1 (v-prediction): the UNets most fixtures train."""

VARIANTS = ("sd15", "sd21")
