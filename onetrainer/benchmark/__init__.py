"""Measurements, not tests: how much the trainer adds per step, and what an SD 1.5 LoRA step costs on a GPU.

`scripts/benchmark.py` runs them and prints a table; `docs/benchmarks.md` explains them and records figures.

    from onetrainer.benchmark.overhead import compare_overhead
    result = compare_overhead(steps=20, warmup=3, repeat=3)   # ours vs a bare diffusers+peft loop, tiny SD 1.5
    from onetrainer.benchmark.gpu import sd15_lora_benchmark
    run = sd15_lora_benchmark(torch.device("cuda"))           # SD 1.5-size UNet LoRA at 512 px
"""

# The benchmarks train `tiny:` models through `run_training`: importing the package registers that source.
import onetrainer.tiny.source  # noqa: F401
