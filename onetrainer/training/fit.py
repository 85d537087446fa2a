"""A run fitted to a VRAM budget: the settings that bring the estimate (`training/estimate.py`) under it.

The steps come in the order that costs the least: what costs no quality and little time first (cached latents and
text, a fine-tune's fused back pass, an 8-bit optimizer, gradient checkpointing), then 8-bit frozen weights,
activation offloading, layer offloading (the smallest fraction that fits, found by halving the interval), and the
batch size last. Each step is taken only where it applies to the model type, the method and the part, and the search
stops as soon as the estimate fits. The result is a list of ordinary config values (`Change`): the app applies them
to the window's config, `scripts/train.py --fit-vram` to the run's, and the user can change each of them afterwards.
The resolution and the data are never touched.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from onetrainer.config.enums import DataType, Optimizer, TrainingMethod
from onetrainer.config.model_types import LAYER_OFFLOADING, PartRole, model_type_info
from onetrainer.config.schema import get_path, json_text, set_path

if TYPE_CHECKING:
    from onetrainer.config import TrainConfig
    from onetrainer.training.estimate import Estimate

GIB = 1024**3
WIDE_DTYPES = (DataType.FLOAT_32, DataType.FLOAT_16, DataType.BFLOAT_16)
MAX_OFFLOAD = 0.9
OFFLOAD_PRECISION = 0.05  # the offload fraction is searched to this step


@dataclass(frozen=True)
class Change:
    path: str
    before: Any
    after: Any
    why: str

    @property
    def json_value(self) -> Any:
        """The new value as a config file holds it (an enum by its name)."""
        return self.after.value if isinstance(self.after, enum.Enum) else self.after

    def text(self) -> str:
        return f"{self.path}: {json_text(self.before)} → {json_text(self.after)} ({self.why})"


@dataclass
class Fit:
    budget: float
    changes: list[Change] = field(default_factory=list)
    estimate: Estimate | None = None

    @property
    def fits(self) -> bool:
        return self.estimate is not None and self.estimate.peak_bytes <= self.budget

    @property
    def headline(self) -> str:
        """The outcome in one line: fitted or not, the budget, the estimate, how many changes."""
        budget = f"{self.budget / GIB:.1f} GiB"
        peak = f"{self.estimate.peak_bytes / GIB:.1f} GiB" if self.estimate is not None else "unknown"
        if not self.changes:
            return f"fits {budget} as it is (≈ {peak})" if self.fits else f"nothing left to change: ≈ {peak}"
        if self.fits:
            return f"fitted to {budget}: ≈ {peak} with {len(self.changes)} change(s)"
        return f"cannot fit {budget}: ≈ {peak} after every change below (a lower resolution, or a LoRA, needs less)"

    def text(self) -> str:
        return "\n".join([self.headline, *(f"  {c.text()}" for c in self.changes)])


def fit_to_budget(
    config: TrainConfig,
    budget_bytes: float,
    flops_per_second: float | None = None,
    device: str = "cuda",
    estimate_of: Callable[[TrainConfig], Estimate] | None = None,
) -> Fit:
    """The changes (applied to a copy, never to `config`) that bring the estimate under `budget_bytes`."""
    from onetrainer.training.estimate import estimate

    def measure(trial: TrainConfig) -> Estimate:
        if estimate_of is not None:
            return estimate_of(trial)
        return estimate(trial, flops_per_second=flops_per_second, device=device)

    trial = config.copy()
    fit = Fit(budget_bytes)
    fit.estimate = measure(trial)
    steps = (
        _caching,
        _fused_back_pass,
        _eight_bit_optimizer,
        _checkpointing,
        _eight_bit_weights,
        _activation_offloading,
        _offloading,
        _batch_size,
    )
    for step in steps:
        if fit.fits:
            break
        step(trial, fit, measure)
    if fit.fits and any(c.path == "batch_size" for c in fit.changes):
        _refine_offloading(trial, fit, measure)  # at the smaller batch, less offloading may do
    return fit


def apply(config: TrainConfig, changes: list[Change]) -> None:
    for change in changes:
        _set_value(config, change)


def _set_value(config: TrainConfig, change: Change) -> None:
    problems = set_path(config, change.path, change.json_value)
    if problems:
        raise ValueError(f"{change.path}: {problems[0].message}")


# -- the steps -------------------------------------------------------------------------------------------------------


def _set(trial: TrainConfig, fit: Fit, path: str, value: Any, why: str) -> None:
    before = get_path(trial, path)
    if before == value:
        return
    change = Change(path, before, value, why)
    _set_value(trial, change)
    fit.changes.append(change)


def _roles(trial: TrainConfig) -> dict[str, PartRole]:
    return model_type_info(trial.model_type).family.part_roles


def _caching(trial: TrainConfig, fit: Fit, measure) -> None:
    if not trial.latent_caching:
        _set(trial, fit, "latent_caching", True, "the encoders leave the GPU once their outputs are cached")
        fit.estimate = measure(trial)


def _fused_back_pass(trial: TrainConfig, fit: Fit, measure) -> None:
    """A fine-tune holds no gradients with the fused back pass (and can then offload its trained layers), where the
    optimizer updates each weight on its own: as fast, no quality lost."""
    from onetrainer.training.fused_back_pass import PER_WEIGHT_OPTIMIZERS

    if (
        trial.training_method is TrainingMethod.FINE_TUNE
        and not trial.optimizer.fused_back_pass
        and trial.optimizer.optimizer in PER_WEIGHT_OPTIMIZERS
        and trial.train_dtype is not DataType.FLOAT_16
        and not trial.multi_gpu
    ):
        why = "each weight updated as its gradient arrives: no gradients held"
        _set(trial, fit, "optimizer.fused_back_pass", True, why)
        fit.estimate = measure(trial)


def _eight_bit_optimizer(trial: TrainConfig, fit: Fit, measure) -> None:
    name = trial.optimizer.optimizer.value
    eight_bit = f"{name}_8BIT"
    if name.endswith("_8BIT") or eight_bit not in Optimizer.__members__:
        return
    if trial.optimizer.fused_back_pass:
        return  # the 8-bit optimizers update all weights together: the fused back pass saves more for a fine-tune
    _set(trial, fit, "optimizer.optimizer", Optimizer(eight_bit), "8-bit optimizer state")
    fit.estimate = measure(trial)


def _checkpointing(trial: TrainConfig, fit: Fit, measure) -> None:
    changed = len(fit.changes)
    for part, role in _roles(trial).items():
        if role in (PartRole.DENOISER, PartRole.TEXT_ENCODER) and trial.part(part).train:
            _set(trial, fit, f"{part}.gradient_checkpointing", True, "activations recomputed in the backward pass")
    if len(fit.changes) > changed:
        fit.estimate = measure(trial)


def _eight_bit_weights(trial: TrainConfig, fit: Fit, measure) -> None:
    """FLOAT_8 for the frozen denoiser (a LoRA's or an embedding's) and the frozen text encoders."""
    changed = len(fit.changes)
    for part, role in _roles(trial).items():
        block = trial.part(part)
        # a LoRA or an embedding trains beside the base weights; a fine-tune trains the weights of its trained parts
        frozen = trial.training_method is not TrainingMethod.FINE_TUNE or not block.train
        if role in (PartRole.DENOISER, PartRole.TEXT_ENCODER) and frozen and block.weight_dtype in WIDE_DTYPES:
            _set(trial, fit, f"{part}.weight_dtype", DataType.FLOAT_8, "frozen weights in 8 bits")
    if len(fit.changes) > changed:
        fit.estimate = measure(trial)


def _activation_offloading(trial: TrainConfig, fit: Fit, measure) -> None:
    denoiser = model_type_info(trial.model_type).family.parts[0]
    block = trial.part(denoiser)
    if block.train and block.gradient_checkpointing and not block.activation_offloading:
        _set(trial, fit, f"{denoiser}.activation_offloading", True, "checkpointed block inputs wait in CPU memory")
        fit.estimate = measure(trial)


OFFLOAD_WHY = "blocks waiting in CPU memory, moved as used"


def _offloadable(trial: TrainConfig) -> list[str]:
    """The parts whose block weights layer offloading can move (a fine-tune's trained parts with the fused back pass
    only, and not beside an EMA; not NFLOAT_4, which stays on the GPU)."""
    from onetrainer.config.enums import EMAMode

    family = model_type_info(trial.model_type).family
    trained_move = trial.optimizer.fused_back_pass and trial.ema is EMAMode.OFF
    return [
        part
        for part in family.parts
        if LAYER_OFFLOADING in family.part_capabilities.get(part, ())
        and trial.part(part).weight_dtype is not DataType.NFLOAT_4
        and not (trial.training_method is TrainingMethod.FINE_TUNE and trial.part(part).train and not trained_move)
    ]


def _smallest_fraction(trial: TrainConfig, parts: list[str], budget: float, measure) -> tuple[float, Estimate]:
    """The smallest offload fraction (one for all `parts`, to `OFFLOAD_PRECISION`) whose estimate fits `budget`,
    else `MAX_OFFLOAD`; with its estimate. Leaves the parts at that fraction."""

    def at(fraction: float) -> Estimate:
        for part in parts:
            trial.part(part).offload_fraction = fraction
        return measure(trial)

    best = at(MAX_OFFLOAD)
    if best.peak_bytes > budget:
        return MAX_OFFLOAD, best
    low, high = 0.0, MAX_OFFLOAD  # low does not fit, high does
    while True:
        middle = round(round((low + high) / 2 / OFFLOAD_PRECISION) * OFFLOAD_PRECISION, 2)
        if middle in (low, high):
            break
        result = at(middle)
        if result.peak_bytes <= budget:
            high, best = middle, result
        else:
            low = middle
    at(high)
    return high, best


def _offloading(trial: TrainConfig, fit: Fit, measure) -> None:
    parts = [p for p in _offloadable(trial) if trial.part(p).offload_fraction == 0]
    if not parts:
        return
    chosen, fit.estimate = _smallest_fraction(trial, parts, fit.budget, measure)
    for part in parts:
        trial.part(part).offload_fraction = 0.0
        _set(trial, fit, f"{part}.offload_fraction", chosen, OFFLOAD_WHY)


def _refine_offloading(trial: TrainConfig, fit: Fit, measure) -> None:
    changed = {c.path.rpartition(".")[0]: i for i, c in enumerate(fit.changes) if c.path.endswith(".offload_fraction")}
    if not changed:
        return
    chosen, fit.estimate = _smallest_fraction(trial, list(changed), fit.budget, measure)
    for index in changed.values():
        fit.changes[index] = Change(fit.changes[index].path, fit.changes[index].before, chosen, OFFLOAD_WHY)


def _batch_size(trial: TrainConfig, fit: Fit, measure) -> None:
    before = trial.batch_size
    while not fit.fits and trial.batch_size > 1:
        trial.batch_size //= 2
        fit.estimate = measure(trial)
    if trial.batch_size != before:
        trial.batch_size, after = before, trial.batch_size
        _set(trial, fit, "batch_size", after, "fewer images per step (raise gradient accumulation to compensate)")
