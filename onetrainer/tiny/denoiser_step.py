"""One training step of a tiny model's denoiser on made-up inputs: shared by the tests (every input the model takes
reaches every parameter) and `scripts/benchmark.py --part tiny` (how long the step takes).

The inputs are the family's: each tiny module maps its denoisers' class names to a function of the model and a draw
of random numbers (`DENOISER_INPUTS`, see `registry.py`) that makes a batch of two at the tests' resolution."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

DENOISERS = ("unet", "transformer", "prior", "decoder")
# The times of the batch's two samples: as schedule steps, or as fractions of the schedule.
TIMESTEPS = (10, 500)
TIME_FRACTIONS = (0.1, 0.7)

Inputs = Callable[[Any, Callable[..., torch.Tensor]], dict[str, Any]]


def denoiser(pipeline: Any) -> torch.nn.Module:
    """The pipeline's trained model: the UNet, the transformer, or the prior / decoder of a two-stage family."""
    return next(getattr(pipeline, name) for name in DENOISERS if getattr(pipeline, name, None) is not None)


def prediction(output: Any) -> torch.Tensor:
    """The tensor a denoiser returns, whether wrapped in an output object or not; a list of per-sample tensors stacked
    into one."""
    sample = output.sample if hasattr(output, "sample") else output
    return torch.stack(sample) if isinstance(sample, list | tuple) else sample


def inputs_function(model: Any) -> Inputs:
    """The function of the tiny module that knows the model's class, which makes its inputs."""
    from onetrainer.tiny.registry import tiny_modules

    kind = type(model).__name__
    for module in tiny_modules():
        function = getattr(module, "DENOISER_INPUTS", {}).get(kind)
        if function is not None:
            return function
    raise KeyError(f"no tiny module makes the inputs of a {kind}")


def denoiser_inputs(model: Any, seed: int = 0) -> dict[str, Any]:
    """A batch of two for the model, with every conditioning input it takes, at the tests' resolution."""
    generator = torch.Generator().manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator)

    return inputs_function(model)(model, randn)


def time_training_step(pipeline: Any, repeat: int = 3) -> list[float]:
    """Seconds of forward + backward per repetition (the first pays one-off setup costs)."""
    model = denoiser(pipeline).train()
    inputs = denoiser_inputs(model)
    timings = []
    for _ in range(repeat):
        model.zero_grad()
        start = time.perf_counter()
        prediction(model(**inputs)).square().mean().backward()
        timings.append(time.perf_counter() - start)
    return timings
