"""The timestep distributions: a draw in [0, 1) from the configured distribution, shifted, which each schedule places
in its own time scale (integer steps, continuous bins, flow σ), plus the GUI's preview histogram (the static shift; a
flow schedule's σ is (step + 1)/T of the same steps, its resolution-dependent shift is not shown).

Everything takes explicit generators, so the same inputs always give the same draws (resume and tests depend on it).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from onetrainer.config.enums import TimestepDistribution

_TABLE_SIZE = 1000


@dataclass(frozen=True)
class TimestepSettings:
    """Which noise levels training draws: the distribution with its weight w and bias b, the static shift (or the
    resolution-dependent one of a flow schedule: `dynamic_shift`) and the [min, max] noising-strength range. Built
    once per run from the config (`training/settings.py`), so that the maths never read the config."""

    distribution: TimestepDistribution
    weight: float
    bias: float
    shift: float
    dynamic_shift: bool
    min_strength: float
    max_strength: float


def unit_timesteps(
    count: int, settings: TimestepSettings, generator: torch.Generator, shift: float | None = None
) -> torch.Tensor:
    """`count` draws in [0, 1) from the timestep distribution (w = weight, b = bias), shifted by `shift` (default:
    the settings' static shift; a flow schedule passes its resolution-dependent shift)."""
    kind, w, b = settings.distribution, settings.weight, settings.bias
    if kind is TimestepDistribution.UNIFORM:
        x = torch.rand(count, generator=generator)
    elif kind is TimestepDistribution.LOGIT_NORMAL:
        z = torch.randn(count, generator=generator)
        # The standard logit-normal (w = b = 0, as the presets train) without the ·1 and +0: the same σ, two
        # operators fewer each step (+0 turns −0 into 0, which the sigmoid maps to the same 0.5).
        z = z if w == 0 else z * (w + 1.0)
        x = torch.sigmoid(z if b == 0 else z + b)
    elif kind is TimestepDistribution.HEAVY_TAIL:
        # SD3's "mode" sampling: more weight in the middle or the ends depending on the scale w.
        u = torch.rand(count, generator=generator)
        x = 1.0 - u - w * (torch.cos(torch.pi / 2 * u) ** 2 - 1.0 + u)
    else:
        # Densities sampled from a table over [0, 1], with uniform jitter inside each cell.
        grid = (torch.arange(_TABLE_SIZE, dtype=torch.float64) + 0.5) / _TABLE_SIZE
        weights = timestep_density(kind, w, b, grid).clamp(min=0)
        if float(weights.sum()) <= 0:
            raise ValueError(f"the {kind.value} distribution with weight {w} and bias {b} has no mass in [0, 1]")
        cells = torch.multinomial(weights.float(), count, replacement=True, generator=generator)
        x = (cells.float() + torch.rand(count, generator=generator)) / _TABLE_SIZE
    x = x.clamp(0.0, 1.0 - 1e-6)
    return shift_timesteps(x, settings.shift if shift is None else shift)


def timestep_density(kind: TimestepDistribution, w: float, b: float, x: torch.Tensor) -> torch.Tensor:
    """The (unnormalised) densities of the table-sampled distributions."""
    if kind is TimestepDistribution.COS_MAP:
        return 2.0 / (torch.pi - 2.0 * torch.pi * x + 2.0 * torch.pi * x**2)
    if kind is TimestepDistribution.SIGMOID:
        return torch.sigmoid(w * (x - (b + 0.5)))
    if kind is TimestepDistribution.INVERTED_PARABOLA:
        return torch.clamp(-w * (x - (b + 0.5)) ** 2 + 2.0, min=0.0)
    if kind is TimestepDistribution.BETA:
        alpha, beta = max(w, 1e-3), max(b, 1e-3)
        return x ** (alpha - 1.0) * (1.0 - x) ** (beta - 1.0)
    raise ValueError(f"{kind.value} is not a table distribution")


def shift_timesteps(x: torch.Tensor, shift: float) -> torch.Tensor:
    """t' = s t / ((s - 1) t + 1): s > 1 moves timesteps towards more noise, s < 1 towards less."""
    if shift == 1.0:
        return x
    return shift * x / ((shift - 1.0) * x + 1.0)


def noising_range(unit: torch.Tensor, settings: TimestepSettings) -> torch.Tensor:
    """A unit draw placed in [min, max] noising strength (the share of the schedule training covers)."""
    low, high = settings.min_strength, settings.max_strength
    if low == 0 and high == 1:  # 0 + 1·u is u exactly: the whole schedule without two operators per step
        return unit
    return low + (high - low) * unit


def sample_timesteps(
    batch: int,
    num_timesteps: int,
    generator: torch.Generator,
    settings: TimestepSettings,
    device,
    shift: float | None = None,
) -> torch.Tensor:
    """Integer timesteps: a draw from the configured distribution on [0, 1], shifted (by `shift`, default the
    settings'), then placed in [min, max] noising strength x T."""
    t = noising_range(unit_timesteps(batch, settings, generator, shift), settings)
    return (t * num_timesteps).long().clamp(0, num_timesteps - 1).to(device)


def timestep_histogram(
    settings: TimestepSettings, bins: int = 100, samples: int = 1_000_000, num_timesteps: int = 1000
) -> torch.Tensor:
    """How often each range of timesteps is drawn with these settings (for the GUI's preview): `bins` counts."""
    t = sample_timesteps(samples, num_timesteps, torch.Generator().manual_seed(0), settings, "cpu")
    return torch.histc(t.float(), bins=bins, min=0, max=num_timesteps - 1)
