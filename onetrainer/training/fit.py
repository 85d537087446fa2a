"""A run fitted to a VRAM budget, and to a host RAM budget: the settings that bring the estimate
(`training/estimate.py`) under them.

The steps come in the order that costs the least: what costs no quality and little time first (cached latents and
text, a fine-tune's fused back pass, an 8-bit optimizer, gradient checkpointing), then 8-bit frozen weights,
activation offloading, layer offloading (the smallest fraction that fits, found by halving the interval), and the
batch size last. On a machine with several GPUs a fine-tune one GPU cannot hold is sharded over them (`_sharding`,
after the fused back pass), and a LoRA that one GPU could hold only by offloading most of its blocks is split over
them (`_splitting`, in place of layer offloading). Each step is taken only where it applies to the model type, the
method and the part, and the search stops as soon as the estimate fits. The result is a list of ordinary config
values (`Change`): the app applies them to the window's config, `scripts/train.py --fit-vram` to the run's, and the
user can change each of them afterwards. The resolution and the data are never touched.

With a RAM budget, a step that would push the estimated host RAM over it (layer offloading keeps every block's weights
in CPU memory, activation offloading the blocks' inputs) is left out and named; a step is kept only where it lowers a
figure that is over its budget. Where the host cannot hold the run whatever changes (loading reads every part into
RAM before any reaches the GPU), the fit says so and what it takes.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from onetrainer.config.enums import DataType, Optimizer, TrainingMethod
from onetrainer.config.model_types import LAYER_OFFLOADING, PartRole, model_type_info
from onetrainer.config.schema import get_path, json_text, set_path
from onetrainer.training.estimate import GIB, Estimate, size_text

if TYPE_CHECKING:
    from onetrainer.config import TrainConfig

__all__ = ["GIB", "Change", "Fit", "apply", "fit_to_budget", "machine_gpus"]
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
    budget: float | None  # VRAM in bytes; None: no VRAM budget
    changes: list[Change] = field(default_factory=list)
    estimate: Estimate | None = None
    ram_budget: float | None = None  # host RAM in bytes
    left_out: list[str] = field(default_factory=list)  # steps that would have broken the RAM budget

    @property
    def fits_vram(self) -> bool:
        return self.estimate is not None and (self.budget is None or self.estimate.peak_bytes <= self.budget)

    @property
    def fits_ram(self) -> bool:
        return self.estimate is not None and (
            self.ram_budget is None or self.estimate.machine_host_bytes <= self.ram_budget
        )

    @property
    def fits(self) -> bool:
        return self.fits_vram and self.fits_ram

    @property
    def headline(self) -> str:
        """The outcome in one line: fitted or not, the budgets, the estimate, how many changes (every size rounded
        as the estimate beside Start rounds it)."""
        budgets = [f"{size_text(self.budget)} VRAM"] if self.budget is not None else []
        budgets += [f"{size_text(self.ram_budget)} RAM"] if self.ram_budget is not None else []
        budget = " and ".join(budgets)
        estimate = self.estimate
        figures = (
            f"{size_text(estimate.peak_bytes)} VRAM, {size_text(estimate.machine_host_bytes)} RAM" if estimate else "?"
        )
        if self.fits:
            if not self.changes:
                return f"fits {budget} as it is (≈ {figures})"
            return f"fitted to {budget}: ≈ {figures} with {len(self.changes)} change(s)"
        why = [] if self.fits_vram else ["a lower resolution, or a LoRA, needs less VRAM"]
        if not self.fits_ram and estimate is not None:
            why.append(self.ram_reason())
        after = "after every change below" if self.changes else "and nothing is left to change"
        return f"cannot fit {budget}: ≈ {figures} {after} ({'; '.join(why)})"

    def ram_reason(self) -> str:
        """What keeps the host RAM over its budget."""
        estimate = self.estimate
        if estimate.host_loading >= estimate.host_training:
            return (
                f"loading alone holds {size_text(estimate.host_loading)} in RAM: the part being read in its weight "
                "dtype (a quantized one in the training dtype), beside the parts read before it as they are kept"
            )
        return f"training keeps {size_text(estimate.host_training)} in RAM: {estimate.host_text()}"

    def text(self) -> str:
        lines = [self.headline, *(f"  {c.text()}" for c in self.changes)]
        lines += [f"  left out for the RAM budget: {step}" for step in self.left_out]
        return "\n".join(lines)


def fit_to_budget(
    config: TrainConfig,
    budget_bytes: float | None,
    flops_per_second: float | None = None,
    device: str = "cuda",
    estimate_of: Callable[[TrainConfig], Estimate] | None = None,
    ram_budget_bytes: float | None = None,
    first: Estimate | None = None,
    gpus: int = 1,
) -> Fit:
    """The changes (applied to a copy, never to `config`) that bring the estimate under `budget_bytes` of VRAM (None:
    no VRAM budget) and, given, `ram_budget_bytes` of host RAM. `first`: the config's estimate already made for
    `device` (the one beside Start), the fit's starting point. `gpus`: the machine's GPUs (each with the budget), over
    which a fine-tune may be sharded (`_sharding`) or a LoRA's denoiser split (`_splitting`)."""
    from onetrainer.training.estimate import estimate

    def measure(trial: TrainConfig) -> Estimate:
        if estimate_of is not None:
            return estimate_of(trial)
        return estimate(trial, flops_per_second=flops_per_second, device=device, device_memory=budget_bytes)

    trial = config.copy()
    fit = Fit(budget_bytes, ram_budget=ram_budget_bytes)
    fit.estimate = first if first is not None else measure(trial)
    steps = (
        _caching,
        _fused_back_pass,
        lambda trial, fit, measure: _sharding(trial, fit, measure, gpus),
        _eight_bit_optimizer,
        _checkpointing,
        _eight_bit_weights,
        _activation_offloading,
        lambda trial, fit, measure: _splitting(trial, fit, measure, gpus),
        _offloading,
        _batch_size,
    )
    for step in steps:
        if fit.fits:
            break
        before, changed, saved = fit.estimate, len(fit.changes), trial.copy()
        step(trial, fit, measure)
        if len(fit.changes) == changed or _helps(fit, before, fit.estimate):
            continue
        if _breaks_ram(fit, before, fit.estimate):
            taken = ", ".join(f"{c.path} {json_text(c.after)}" for c in fit.changes[changed:])
            fit.left_out.append(f"{taken} (≈ {size_text(fit.estimate.machine_host_bytes)} RAM)")
        trial, fit.estimate = saved, before
        del fit.changes[changed:]
    if fit.fits and any(c.path == "batch_size" for c in fit.changes):
        _refine_offloading(trial, fit, measure)  # at the smaller batch, less offloading may do
    return fit


def machine_gpus(train_device: str) -> int:
    """The GPUs a fit may shard or split over: the visible CUDA devices where the config trains on CUDA, else 1."""
    from onetrainer.training.estimate import training_device_type

    if training_device_type(train_device) != "cuda":
        return 1
    import torch

    return torch.cuda.device_count()


def _breaks_ram(fit: Fit, before: Estimate, after: Estimate) -> bool:
    """Whether a step pushed the host RAM over its budget, or further over it."""
    return fit.ram_budget is not None and after.machine_host_bytes > max(fit.ram_budget, before.machine_host_bytes)


def _helps(fit: Fit, before: Estimate, after: Estimate) -> bool:
    """Whether a step's changes are worth keeping: they lower a figure that is over its budget without breaking the
    RAM budget."""
    if _breaks_ram(fit, before, after):
        return False
    vram_over = fit.budget is not None and before.peak_bytes > fit.budget
    ram_over = fit.ram_budget is not None and before.machine_host_bytes > fit.ram_budget
    return (vram_over and after.peak_bytes < before.peak_bytes) or (
        ram_over and after.machine_host_bytes < before.machine_host_bytes
    )


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
    from onetrainer.training.fused_back_pass import FUSABLE_OPTIMIZERS

    if (
        trial.training_method is TrainingMethod.FINE_TUNE
        and not trial.optimizer.fused_back_pass
        and trial.optimizer.optimizer in FUSABLE_OPTIMIZERS
        and trial.train_dtype is not DataType.FLOAT_16
        and not trial.multi_gpu
    ):
        why = "each weight updated as its gradient arrives: no gradients held"
        _set(trial, fit, "optimizer.fused_back_pass", True, why)
        fit.estimate = measure(trial)


# Sharding on its own, then with what it combines with that saves more (activations recomputed; the shards in host RAM).
SHARDED_WITH = ((), ("checkpointing",), ("checkpointing", "sharded_cpu_offload"))


def _sharding(trial: TrainConfig, fit: Fit, measure, gpus: int) -> None:
    """A full fine-tune that one GPU cannot hold even with the fused back pass, sharded over the machine's `gpus`
    (`multi_gpu_mode` SHARDED: each GPU holds 1/N of the trained weights, gradients and optimizer state): taken only
    where the sharded estimate fits the budget — on its own, else with gradient checkpointing, else with the shards
    in host RAM too — and the config combines with sharding (`checks.check_sharded`), in place of the fused back pass
    (which sharding does not combine with). Not taken, nothing changes and the one-GPU steps go on."""
    from onetrainer.config.enums import MultiGpuMode
    from onetrainer.training.checks import check_sharded

    if gpus < 2 or trial.training_method is not TrainingMethod.FINE_TUNE:
        return
    if trial.multi_gpu and trial.multi_gpu_mode is MultiGpuMode.SHARDED:
        return
    base = trial.copy()
    trained = [p for p in _roles(base) if getattr(base.part(p), "train", False)]
    # What sharding replaces, undone where an earlier step of the fit took it: the fused back pass, the trained parts'
    # layer offloading (their shards are on each GPU, or in host RAM with `sharded_cpu_offload`).
    replaced = {"optimizer.fused_back_pass", *(f"{p}.offload_fraction" for p in trained)}
    undone = [c for c in fit.changes if c.path in replaced]
    for change in undone:
        _set_value(base, Change(change.path, change.after, change.before, ""))
    listed = [i.strip() for i in base.device_indexes.split(",") if i.strip()]
    if not (base.multi_gpu and len(listed) >= 2):  # the GPUs the config lists for several processes, else all
        base.device_indexes = ",".join(str(i) for i in range(gpus))
    base.multi_gpu, base.multi_gpu_mode = True, MultiGpuMode.SHARDED
    needed = _sharding_needs(base, trained)
    for path, value, _why in needed:
        _set_value(base, Change(path, get_path(base, path), value, ""))
    if any(p.is_error for p in check_sharded(base)):
        return
    for extra in SHARDED_WITH:
        candidate, scratch = base.copy(), Fit(fit.budget, ram_budget=fit.ram_budget)
        if "checkpointing" in extra:
            _checkpointing(candidate, scratch, lambda _trial: None)
        if "sharded_cpu_offload" in extra:
            candidate.sharded_cpu_offload = True
        estimate = measure(candidate)
        if fit.budget is None or estimate.peak_bytes > fit.budget or _breaks_ram(fit, fit.estimate, estimate):
            continue
        for change in undone:  # back as it was: sharding replaces it
            fit.changes.remove(change)
            _set_value(trial, Change(change.path, change.after, change.before, ""))
        processes = len([i for i in base.device_indexes.split(",") if i.strip()])
        why = f"the trained weights, gradients and optimizer state split over {processes} GPUs"
        for path, value, reason in needed:
            _set(trial, fit, path, value, reason)
        _set(trial, fit, "multi_gpu", True, "one process per GPU")
        _set(trial, fit, "multi_gpu_mode", MultiGpuMode.SHARDED, why)
        _set(trial, fit, "device_indexes", base.device_indexes, "the GPUs the run shards over")
        fit.changes += scratch.changes
        apply(trial, scratch.changes)
        if "sharded_cpu_offload" in extra:
            _set(trial, fit, "sharded_cpu_offload", True, "the shards wait in host RAM between steps")
        fit.estimate = estimate
        return


def _sharding_needs(config: TrainConfig, trained: list[str]) -> list[tuple[str, Any, str]]:
    """The settings a config must change to be sharded (path, value, why), one for each of what `check_sharded`
    refuses (`checks.SHARDED_REFUSALS`): the fused back pass off, a trained part's layer offloading off (the shards
    replace it), and BFLOAT_16 trained weights with stochastic rounding kept in FLOAT_32 instead (gathered and computed
    in the 16-bit train dtype, as sharding does; it does not round its updates stochastically), so that small updates
    are kept as the rounding kept them."""
    from onetrainer.training.checks import sharded_refusals

    return [(path, value, r.why) for r in sharded_refusals(config, trained) for path, value in r.changes]


# Layer offloading on one GPU up to this fraction of the blocks is preferred to a model split: the blocks' copies hide
# behind the compute (docs/benchmarks.md: 70 % of a 12 B transformer's blocks 2–5 % slower on an H200's PCIe 5; a
# consumer card's PCIe 4 at fewer lanes moves them several times slower), and the other GPUs stay free. Beyond it,
# the split.
SPLIT_BEYOND_OFFLOAD = 0.5


def _splitting(trial: TrainConfig, fit: Fit, measure, gpus: int) -> None:
    """A LoRA that one GPU cannot hold after the cheap one-GPU steps (cached encoders, an 8-bit optimizer,
    checkpointing, 8-bit frozen weights, activation offloading), split over the machine's `gpus` (`multi_gpu_mode`
    MODEL_SPLIT: one process, the denoiser's blocks spread over the GPUs by their memory, `split_devices` the GPUs the
    config lists for several processes, else all) in place of layer offloading — where one GPU would have to offload
    more than `SPLIT_BEYOND_OFFLOAD` of the blocks, or cannot fit at any fraction, or only by breaking the RAM budget
    (offloading keeps every block's weights in host RAM; the split keeps none there).

    Why there: the split costs no quality and next to no time against one GPU (the GPUs take turns; only the hidden
    states cross between them, `docs/benchmarks.md`'s split part), but it takes the other GPUs, which then do nothing
    in parallel; a little layer offloading costs one GPU a few per cent, so up to half the blocks offloading is the
    cheaper answer, and beyond that (the window shrinks, the copies stop hiding behind the compute, and every step
    moves most of the model over PCIe) a user with GPUs to spare is better served by the split. A config already
    training data parallel keeps offloading wherever any fraction fits: each GPU then still trains its own share of
    the batch, which the split (one process) would give up. Taken only where the split's estimate (each GPU the
    budget) fits and `checks.check_model_split` allows it (the devices it names are the `gpus` the caller says the
    machine has); the denoiser's layer offloading, which a split does not combine with, is set to 0 with it. Not
    taken, nothing changes and layer offloading goes on."""
    from onetrainer.config.enums import MultiGpuMode
    from onetrainer.training.checks import check_model_split

    if gpus < 2 or fit.budget is None or trial.training_method is not TrainingMethod.LORA:
        return
    if trial.multi_gpu and trial.multi_gpu_mode is MultiGpuMode.MODEL_SPLIT:
        return
    parallel = trial.multi_gpu and trial.multi_gpu_mode is MultiGpuMode.DATA_PARALLEL
    scratch = trial.copy()
    parts = [p for p in _offloadable(scratch) if scratch.part(p).offload_fraction == 0]
    if parts:  # how far one GPU would offload (the next step's search)
        fraction, offloaded = _smallest_fraction(scratch, parts, fit.budget, measure)
        fits = offloaded.peak_bytes <= fit.budget and not _breaks_ram(fit, fit.estimate, offloaded)
        if fits and (fraction <= SPLIT_BEYOND_OFFLOAD or parallel):
            return
    denoiser = model_type_info(trial.model_type).family.parts[0]
    base = trial.copy()
    listed = [i.strip() for i in base.device_indexes.split(",") if i.strip()]
    indexes = listed if base.multi_gpu and len(listed) >= 2 else [str(i) for i in range(gpus)]
    devices = ",".join(f"cuda:{i}" for i in indexes)
    base.multi_gpu, base.multi_gpu_mode, base.split_devices = True, MultiGpuMode.MODEL_SPLIT, devices
    base.part(denoiser).offload_fraction = 0.0
    if any(p.is_error and p.path != "split_devices" for p in check_model_split(base)):
        return
    estimate = measure(base)
    if estimate.peak_bytes > fit.budget or _breaks_ram(fit, fit.estimate, estimate):
        return
    _set(trial, fit, "multi_gpu", True, "the denoiser over several GPUs, one process")
    why = f"the denoiser's blocks spread over {len(indexes)} GPUs by their memory (no faster than one GPU)"
    _set(trial, fit, "multi_gpu_mode", MultiGpuMode.MODEL_SPLIT, why)
    _set(trial, fit, "split_devices", devices, "the GPUs the blocks are spread over")
    _set(trial, fit, f"{denoiser}.offload_fraction", 0.0, "a split is not combined with layer offloading")
    fit.estimate = estimate


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


def _smallest_fraction(trial: TrainConfig, parts: list[str], budget: float | None, measure) -> tuple[float, Estimate]:
    """The smallest offload fraction (one for all `parts`, to `OFFLOAD_PRECISION`) whose estimate fits `budget`,
    else `MAX_OFFLOAD`; with its estimate. Leaves the parts at that fraction."""

    def at(fraction: float) -> Estimate:
        for part in parts:
            trial.part(part).offload_fraction = fraction
        return measure(trial)

    budget = math.inf if budget is None else budget
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
    while not fit.fits_vram and trial.batch_size > 1:  # a smaller batch saves VRAM, next to no RAM
        trial.batch_size //= 2
        fit.estimate = measure(trial)
    if trial.batch_size != before:
        trial.batch_size, after = before, trial.batch_size
        _set(trial, fit, "batch_size", after, "fewer images per step (raise gradient accumulation to compensate)")
