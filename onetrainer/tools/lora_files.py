"""Operations on trained LoRA files, without the base model: shrink the rank (`resize`), combine several into one
(`merge_loras`), and average the checkpoints of one run after the fact (`average_checkpoints`, a post-hoc EMA, on the
files' tensors: every adapter kind).

A plain LoRA module is a pair of factors in one of the two layouts this trainer writes: kohya's (`X.lora_down.weight`,
`X.lora_up.weight` and `X.alpha`, applied as up·down·alpha/rank; what AUTOMATIC1111, Forge and ComfyUI load) and
diffusers' (`X.lora_A.weight`, `X.lora_B.weight`, alpha folded into lora_B: applied as B·A). A convolution's down
factor is (rank, in, kh, kw) and its up factor (out, rank, 1, 1). Other tensors (bundled embeddings) pass through.
Resizing and merging refuse LoHa, LoKr, DoRA and OFT modules with their name: their weight change is not a product of
two factors.

The weight change of a module is ΔW = up·down·scale. Resizing and merging at a target rank keep the best rank-r
approximation of ΔW (SVD, per module); the kohya layout keeps each module's alpha-to-rank ratio (the strength a
consumer applies stays the same), the diffusers layout folds the scale into the up factor as before.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

KOHYA = "kohya"
DIFFUSERS = "diffusers"
_SUFFIXES = {
    KOHYA: (".lora_down.weight", ".lora_up.weight"),
    DIFFUSERS: (".lora_A.weight", ".lora_B.weight"),
}
_OTHER_KINDS = ("hada_w1_a", "lokr_w1", "lokr_w2", "dora_scale", "oft_R", "oft_blocks", "lora_magnitude")


class LoraFileError(ValueError):
    """A LoRA file this operation cannot work on; the message names the module or the file."""


@dataclass
class LoraModule:
    down: torch.Tensor  # (rank, in) or (rank, in, kh, kw)
    up: torch.Tensor  # (out, rank) or (out, rank, 1, 1)
    alpha: float | None  # kohya's alpha; None in the diffusers layout (scale 1)

    @property
    def rank(self) -> int:
        return self.down.shape[0]

    @property
    def scale(self) -> float:
        return 1.0 if self.alpha is None else self.alpha / self.rank

    def delta(self) -> torch.Tensor:
        """ΔW as a matrix (out, in·kh·kw), float32."""
        return (self.up.float().flatten(1) @ self.down.float().flatten(1)) * self.scale


@dataclass
class LoraFile:
    layout: str
    modules: dict[str, LoraModule]
    other: dict[str, torch.Tensor]  # tensors that are not LoRA factors (bundled embeddings), kept as they are
    dtype: torch.dtype  # the factors' dtype in the file


def read_lora(state: Mapping[str, torch.Tensor], name: str = "the LoRA") -> LoraFile:
    """The plain LoRA modules of a state dict; errors name `name` and the module."""
    for key in state:
        if any(f".{kind}" in key for kind in _OTHER_KINDS):
            module = key.rsplit(".", 2)[0] if key.endswith(".weight") else key.rsplit(".", 1)[0]
            raise LoraFileError(
                f"{name}: {module} is a LoHa, LoKr, DoRA or OFT module; only plain LoRA files can be resized, merged "
                "or averaged this way"
            )
    layouts = [lay for lay, (down, _) in _SUFFIXES.items() if any(k.endswith(down) for k in state)]
    if len(layouts) != 1:
        raise LoraFileError(f"{name}: no LoRA factors found" if not layouts else f"{name}: mixes kohya and diffusers")
    layout = layouts[0]
    down_suffix, up_suffix = _SUFFIXES[layout]
    modules: dict[str, LoraModule] = {}
    used: set[str] = set()
    for key, down in state.items():
        if not key.endswith(down_suffix):
            continue
        module = key[: -len(down_suffix)]
        up = state.get(module + up_suffix)
        if up is None:
            raise LoraFileError(f"{name}: {module} has a down factor but no up factor")
        alpha = state.get(module + ".alpha") if layout == KOHYA else None
        modules[module] = LoraModule(down, up, float(alpha) if alpha is not None else None)
        if layout == KOHYA and alpha is None:
            modules[module].alpha = float(down.shape[0])  # kohya without alpha: scale 1
        used |= {key, module + up_suffix, module + ".alpha"}
    other = {k: v for k, v in state.items() if k not in used}
    dtype = next(iter(modules.values())).down.dtype
    return LoraFile(layout, modules, other, dtype)


def write_lora(lora: LoraFile, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    down_suffix, up_suffix = _SUFFIXES[lora.layout]
    dtype = dtype or lora.dtype
    out: dict[str, torch.Tensor] = {}
    for name, module in lora.modules.items():
        out[name + down_suffix] = module.down.to(dtype).contiguous()
        out[name + up_suffix] = module.up.to(dtype).contiguous()
        if lora.layout == KOHYA:
            out[name + ".alpha"] = torch.tensor(float(module.alpha))
    return {**out, **lora.other}


def _factors(delta: torch.Tensor, rank: int, like: LoraModule) -> tuple[torch.Tensor, torch.Tensor, float]:
    """down, up of the best rank-`rank` approximation of `delta` (out, in·k), shaped as `like`'s, and the share of
    ΔW's energy (Σσ²) they keep."""
    u, s, vh = torch.linalg.svd(delta, full_matrices=False)
    rank = max(1, min(rank, s.numel()))
    root = s[:rank].sqrt()
    down = root[:, None] * vh[:rank]
    up = u[:, :rank] * root[None, :]
    total = float((s**2).sum())
    kept = float((s[:rank] ** 2).sum()) / total if total > 0 else 1.0
    if like.down.dim() == 4:  # a convolution: (rank, in, kh, kw) and (out, rank, 1, 1)
        down = down.reshape(rank, *like.down.shape[1:])
        up = up.reshape(up.shape[0], rank, 1, 1)
    return down, up, kept


def _energy_rank(delta: torch.Tensor, energy: float, limit: int) -> int:
    s = torch.linalg.svdvals(delta)
    share = torch.cumsum(s**2, 0) / max(float((s**2).sum()), 1e-30)
    return min(limit, int((share < energy).sum()) + 1)


def _rebuilt(layout: str, delta: torch.Tensor, rank: int, like: LoraModule, ratio: float) -> tuple[LoraModule, float]:
    """A module of `rank` for ΔW = `delta`; kohya's alpha is `ratio`·rank (the scale a consumer applies)."""
    down, up, kept = _factors(delta, rank, like)
    new_rank = down.shape[0]
    alpha = None if layout == DIFFUSERS else ratio * new_rank
    scale = 1.0 if alpha is None else alpha / new_rank
    return LoraModule(down, up / scale, alpha), kept


# (done, total) before each module; a caller's callback may raise to stop (the tools window's Cancel).
LayerProgress = Callable[[int, int], None]


def _report(progress: LayerProgress | None, done: int, total: int) -> None:
    if progress is not None:
        progress(done, total)


@dataclass(frozen=True)
class ModuleReport:
    module: str
    rank_before: int
    rank_after: int
    kept_energy: float  # Σσ² kept / Σσ² of ΔW


def resize(
    lora: LoraFile, rank: int | None = None, energy: float | None = None, progress: LayerProgress | None = None
) -> tuple[LoraFile, list[ModuleReport]]:
    """Each module at `rank` (or the smallest rank keeping `energy` of ΔW's Σσ², at most its own), never above its
    own rank; kohya's alpha-to-rank ratio is kept, so the strength stays."""
    if (rank is None) == (energy is None):
        raise LoraFileError("give a rank or an energy share to keep, not both")
    if rank is not None and rank < 1:
        raise LoraFileError(f"the rank must be at least 1, not {rank}")
    if energy is not None and not 0.0 < energy <= 1.0:
        raise LoraFileError(f"the energy share must lie in (0, 1], not {energy}")
    modules, reports = {}, []
    for index, (name, module) in enumerate(lora.modules.items()):
        _report(progress, index, len(lora.modules))
        delta = module.delta()
        target = min(module.rank, rank if rank is not None else _energy_rank(delta, energy, module.rank))
        ratio = module.scale  # alpha / rank
        modules[name], kept = _rebuilt(lora.layout, delta, target, module, ratio)
        reports.append(ModuleReport(name, module.rank, modules[name].rank, kept))
    return LoraFile(lora.layout, modules, dict(lora.other), lora.dtype), reports


def merge_loras(
    loras: Sequence[LoraFile],
    strengths: Sequence[float],
    rank: int | None = None,
    progress: LayerProgress | None = None,
) -> tuple[LoraFile, list[ModuleReport]]:
    """Σ strengthᵢ·ΔWᵢ per module as one LoRA: exactly, the ranks concatenated (alpha = the summed rank: scale 1),
    or at `rank` by SVD, each module's share of the sum's Σσ² kept reported (from the summed rank: no report for an
    exact merge). Every file must have the same layout; a module some files lack takes the others' sum."""
    if len(loras) != len(strengths):
        raise LoraFileError(f"{len(loras)} LoRAs but {len(strengths)} strengths")
    if len({lora.layout for lora in loras}) != 1:
        raise LoraFileError(
            "the LoRAs are in different layouts (kohya and diffusers); convert them to one with "
            "scripts/convert_model.py first"
        )
    layout = loras[0].layout
    names = list(dict.fromkeys(name for lora in loras for name in lora.modules))
    modules: dict[str, LoraModule] = {}
    reports: list[ModuleReport] = []
    for index, name in enumerate(names):
        _report(progress, index, len(names))
        parts = [(lora.modules[name], s) for lora, s in zip(loras, strengths) if name in lora.modules]
        shapes = {(m.up.shape[0], *m.down.shape[1:]) for m, _ in parts}
        if len(shapes) != 1:
            raise LoraFileError(f"{name} has different shapes in the LoRAs: {sorted(shapes)}; are they for one model?")
        if rank is None:
            down = torch.cat([m.down.float() for m, _ in parts], dim=0)
            up = torch.cat([m.up.float() * (s * m.scale) for m, s in parts], dim=1)
            modules[name] = LoraModule(down, up, None if layout == DIFFUSERS else float(down.shape[0]))
        else:
            delta = sum(s * m.delta() for m, s in parts)
            modules[name], kept = _rebuilt(layout, delta, rank, parts[0][0], 1.0)
            reports.append(ModuleReport(name, sum(m.rank for m, _ in parts), modules[name].rank, kept))
    other: dict[str, torch.Tensor] = {}
    for lora in loras:
        other.update({k: v for k, v in lora.other.items() if k not in other})
    return LoraFile(layout, modules, other, loras[0].dtype), reports


def power_ema_weights(steps: Sequence[float], sigma_rel: float) -> list[float]:
    """Karras et al.'s power-function EMA with relative width `sigma_rel`, over checkpoints saved at `steps`: the
    profile weighs training time t by t^γ, so checkpoint i (standing for (stepᵢ₋₁, stepᵢ]) gets
    stepᵢ^(γ+1) − stepᵢ₋₁^(γ+1), normalised. γ solves σ_rel² = (γ+1) / ((γ+2)² (γ+3))."""
    if not 0.0 < sigma_rel < 0.5:
        raise LoraFileError(f"sigma_rel must lie in (0, 0.5), not {sigma_rel}")
    low, high = 0.0, 1e6  # σ_rel falls as γ grows; σ_rel(0) = 1/√12 ≈ 0.289
    if sigma_rel >= math.sqrt(1 / 12):
        gamma = 0.0
    else:
        for _ in range(200):
            mid = (low + high) / 2
            value = math.sqrt((mid + 1) / ((mid + 2) ** 2 * (mid + 3)))
            low, high = (mid, high) if value > sigma_rel else (low, mid)
        gamma = (low + high) / 2
    edges = [0.0, *steps]
    if any(b <= a for a, b in itertools.pairwise(edges)):
        raise LoraFileError("the checkpoints' steps must increase")
    top = edges[-1]
    weights = [(b / top) ** (gamma + 1) - (a / top) ** (gamma + 1) for a, b in itertools.pairwise(edges)]
    total = sum(weights)
    return [w / total for w in weights]


def decay_weights(count: int, decay: float) -> list[float]:
    """The classic EMA over `count` checkpoints in order (the first starts it): ema = decay·ema + (1 − decay)·θ."""
    if not 0.0 <= decay < 1.0:
        raise LoraFileError(f"the decay must lie in [0, 1), not {decay}")
    weights = [decay ** (count - 1)] + [(1 - decay) * decay ** (count - 1 - i) for i in range(1, count)]
    return weights


def average_checkpoints(
    states: Sequence[Mapping[str, torch.Tensor]],
    weights: Sequence[float],
    names: Sequence[str] | None = None,
    progress: LayerProgress | None = None,
) -> dict[str, torch.Tensor]:
    """The weighted average of every tensor of checkpoints of one run, as musubi-tuner's post-hoc EMA averages them.
    An EMA averages parameters, so any adapter kind averages alike (LoRA, LoHa, LoKr, DoRA, OFT); every file must
    hold the same tensors at the same shapes, and settings stored as tensors (kohya's `.alpha`) the same values."""
    if len(states) < 2:
        raise LoraFileError("an average needs at least two checkpoints")
    names = list(names or [f"checkpoint {i}" for i in range(1, len(states) + 1)])
    first = states[0]
    for name, state in zip(names[1:], states[1:]):
        if state.keys() != first.keys():
            missing = sorted(first.keys() - state.keys()) or sorted(state.keys() - first.keys())
            raise LoraFileError(f"{name} has other tensors than {names[0]} ({missing[0]} …): not the same run?")
        for key, tensor in state.items():
            if tensor.shape != first[key].shape:
                raise LoraFileError(f"{name}: {key} is {tuple(tensor.shape)}, {tuple(first[key].shape)} in {names[0]}")
            if key.endswith(".alpha") and not torch.equal(tensor, first[key]):
                raise LoraFileError(f"{name}: {key} differs from {names[0]}'s: another alpha, not the same run?")
    out: dict[str, torch.Tensor] = {}
    for index, (key, tensor) in enumerate(first.items()):
        _report(progress, index, len(first))
        if key.endswith(".alpha") or not tensor.is_floating_point():
            out[key] = tensor
            continue
        total = torch.zeros(tensor.shape, dtype=torch.float32)
        for state, weight in zip(states, weights):
            total += weight * state[key].float()
        out[key] = total.to(tensor.dtype)
    return out
