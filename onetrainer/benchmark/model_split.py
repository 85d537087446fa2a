"""`scripts/benchmark.py --part split`: what MODEL_SPLIT (`memory/model_split.py`) costs per step. One training step
(forward + backward, batch 2) of a tiny denoiser whole and split in halves over two devices, alternating: over two
CPU "devices" the figure is the hooks' own cost (nothing is copied); with CUDA, over two GPUs (or a GPU and the CPU
where there is one GPU), also the hand-over. The tiny models compute little, so the ratio is an upper bound of what
the hooks add to a full-size step."""

from __future__ import annotations

import statistics
import time

PART_HELP = "one tiny denoiser step whole vs split over two devices (two CPU 'devices'; with CUDA two GPUs too)"
TITLE = "Model split (MODEL_SPLIT), one tiny denoiser step, whole vs split in halves"
VARIANTS = ("flux-dev", "pixart")


def split_pairs() -> list[tuple[str, str]]:
    """The device pairs measured here: two CPU "devices", and with CUDA two GPUs (one GPU: it and the CPU)."""
    import torch

    pairs = [("cpu", "cpu")]
    if torch.cuda.is_available():
        pairs.append(("cuda:0", "cuda:1") if torch.cuda.device_count() > 1 else ("cuda:0", "cpu"))
    return pairs


def compare_split(repeat: int = 5, steps: int = 5) -> dict[str, dict]:
    """Per variant and device pair: the median over `repeat` alternating repetitions of each one's best of `steps`
    steps, whole and split, in ms, and their ratio."""
    import torch

    from onetrainer.families import load_family_class
    from onetrainer.memory.model_split import ModelSplit, assign_blocks, block_modules
    from onetrainer.tiny import TINY_VARIANTS, build_tiny_pipeline
    from onetrainer.tiny.denoiser_step import denoiser, denoiser_inputs

    figures: dict[str, dict] = {}
    for variant in VARIANTS:
        family = load_family_class(TINY_VARIANTS[variant].model_type.name)
        paths = family.layer_blocks[family.info.parts[0]]
        for pair in split_pairs():
            model = denoiser(build_tiny_pipeline(variant, seed=0)).train()
            first = torch.device(pair[0])
            model.to(first)
            inputs = {k: v.to(first) if isinstance(v, torch.Tensor) else v for k, v in denoiser_inputs(model).items()}
            count = len(block_modules(model, paths))
            split = ModelSplit(model, paths, pair, assign_blocks([1] * count, [1, 1]))

            times: dict[str, list[float]] = {"whole": [], "split": []}
            for _ in range(repeat):
                for kind in times:
                    if kind == "split":
                        split.attach()
                    else:
                        split.detach(first)
                    _step(model, inputs, first)
                    times[kind].append(min(_step(model, inputs, first) for _ in range(steps)))
            split.remove()
            whole, parted = statistics.median(times["whole"]), statistics.median(times["split"])
            key = f"{variant} {pair[0]},{pair[1]}"
            figures[key] = {
                "blocks": count,
                "whole_ms": whole * 1000,
                "split_ms": parted * 1000,
                "ratio": parted / whole,
            }
            print(f"{key:<24}{count:>4} blocks   whole {whole * 1000:8.2f} ms   split {parted * 1000:8.2f} ms   "
                  f"split / whole {parted / whole:.3f}")  # fmt: skip
    return figures


def _step(model, inputs: dict, device) -> float:
    """Seconds of one forward and backward pass."""
    import torch

    from onetrainer.tiny.denoiser_step import prediction

    model.zero_grad()
    start = time.perf_counter()
    prediction(model(**inputs)).square().mean().backward()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start
