"""The optimizer factory, built on the optimizer table (`onetrainer.config.optimizers`).

Each optimizer is one table row: where its class lives, the parameters it takes and a few facts (adaptive,
schedule-free). The GUI's "..." dialog is generated from the same rows; each parameter's label and tooltip come from
its declaration in `TrainOptimizerConfig`. The user's last settings per optimizer live in the config's
`optimizer_defaults`.
"""

from __future__ import annotations

import copy
import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from onetrainer.config.enums import Optimizer
from onetrainer.config.optimizer_config import TrainOptimizerConfig
from onetrainer.config.optimizers import OPTIMIZERS, Kwargs, OptimizerSpec

__all__ = ["OPTIMIZERS", "OptimizerSpec", "create_optimizer", "optimizer_spec"]

if TYPE_CHECKING:
    from onetrainer.config import TrainConfig
    from onetrainer.training.muon import MuonLayout


def optimizer_spec(optimizer: Optimizer) -> OptimizerSpec:
    spec = OPTIMIZERS.get(optimizer)
    if spec is None:
        offered = ", ".join(o.value for o in OPTIMIZERS)
        raise NotImplementedError(f"the optimizer {optimizer.value} is not available; choose one of {offered}")
    return spec


def resolved_parameters(config: TrainOptimizerConfig) -> Kwargs:
    """The table's defaults for the chosen optimizer, overridden by every parameter the user set (non-null)."""
    spec = optimizer_spec(config.optimizer)
    return {
        name: (getattr(config, name) if getattr(config, name) is not None else d) for name, d in spec.defaults.items()
    }


def create_optimizer(
    config: TrainOptimizerConfig,
    param_groups: list[dict],
    learning_rate: float,
    warmup_steps: int = 0,
    muon_layout: MuonLayout | None = None,
):
    """Build the optimizer for named parameter groups (each group dict has "params", "lr" and "name"; the methods'
    also "param_names" and "part", which only Muon reads: they are not passed on)."""
    spec = optimizer_spec(config.optimizer)
    if spec.aux_adam is None:
        for group in param_groups:
            group.pop("param_names", None)
            group.pop("part", None)
    module_name, _, class_name = spec.class_path.partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except ImportError as e:
        raise RuntimeError(
            f"the optimizer {spec.optimizer.value} needs the package '{spec.package}', which cannot be imported "
            f"here ({e}); install it or choose another optimizer"
        ) from None
    kwargs = spec.constructor_kwargs(resolved_parameters(config))
    if spec.aux_adam is not None:
        from onetrainer.training import muon

        try:
            return muon.create(spec, config, kwargs, param_groups, muon_layout)
        except (RuntimeError, ValueError, TypeError) as e:
            raise RuntimeError(f"the optimizer {spec.optimizer.value} cannot be created here: {e}") from None
    if spec.optimizer is Optimizer.ADAFACTOR and kwargs.get("relative_step"):
        # Adaptive mode: Adafactor computes the step size from the step count; it must not be given one.
        for group in param_groups:
            group.pop("lr", None)
        return cls(param_groups, lr=None, **kwargs)
    if spec.warmup:  # schedule-free optimizers warm up themselves; adv-optm's Kourkoutas-beta holds beta2 meanwhile
        kwargs[spec.warmup] = warmup_steps
    try:
        return cls(param_groups, lr=learning_rate, **kwargs)
    except (RuntimeError, ValueError, TypeError) as e:
        raise RuntimeError(f"the optimizer {spec.optimizer.value} cannot be created here: {e}") from None


def effective_learning_rates(optimizer) -> dict[str, float]:
    """The current rate of each named group; adaptive optimizers report lr x d, the rate they really use."""
    rates: dict[str, float] = {}
    for i, group in enumerate(optimizer.param_groups):
        name = str(group.get("name", f"group_{i}"))
        lr = group.get("lr")
        if lr is None:  # Adafactor's relative step: the rate it used for the first parameter
            lr = _adafactor_rate(optimizer, group)
        lr = float(group.get("effective_lr", lr))  # Prodigy + schedule-free: the rate its warmup lets through
        if group.get("d") is not None:
            lr *= float(group["d"])
        rates[name] = lr
    return rates


def _adafactor_rate(optimizer, group) -> float:
    for param in group["params"]:
        state = optimizer.state.get(param)
        if state and "step" in state:
            return float(optimizer._get_lr(group, state))
    return 0.0


# -- the per-optimizer settings users keep (OneTrainer's "..." dialog and "Load defaults") ----------------------------


def table_defaults(optimizer: Optimizer) -> TrainOptimizerConfig:
    """A fresh optimizer block with the table's defaults for `optimizer`."""
    block = TrainOptimizerConfig(optimizer=optimizer)
    for name, value in optimizer_spec(optimizer).defaults.items():
        setattr(block, name, copy.deepcopy(value))  # a dict default (muon_adam_config) is not shared
    return block


def switch_optimizer(config: TrainConfig, optimizer: Optimizer) -> None:
    """Choose another optimizer: keep the current settings for the one left, restore the last ones of the new one."""
    current = config.optimizer
    config.optimizer_defaults[current.optimizer.value] = copy.deepcopy(current)
    saved = config.optimizer_defaults.get(optimizer.value)
    config.optimizer = copy.deepcopy(saved) if saved is not None else table_defaults(optimizer)
    config.optimizer.optimizer = optimizer


def load_optimizer_defaults(config: TrainConfig) -> None:
    """ "Load defaults": the table's values for the chosen optimizer, forgetting the remembered ones."""
    config.optimizer_defaults.pop(config.optimizer.optimizer.value, None)
    config.optimizer = table_defaults(config.optimizer.optimizer)


def remember_optimizer_settings(config: TrainConfig) -> None:
    """Store the current block as the last settings of its optimizer (when the dialog closes)."""
    config.optimizer_defaults[config.optimizer.optimizer.value] = copy.deepcopy(config.optimizer)


@dataclass(frozen=True)
class OptimizerParameter:
    """One row of an optimizer's "..." dialog."""

    name: str
    default: Any
    kind: str  # "bool", "int", "float"
    label: str
    help: str


def dialog_parameters(optimizer: Optimizer) -> list[OptimizerParameter]:
    """The parameters the "..." dialog shows for `optimizer`, with labels and tooltips from the config declaration."""
    rows = []
    defaults = optimizer_spec(optimizer).defaults
    for name, default in defaults.items():
        spec = TrainOptimizerConfig.spec(name)
        assert spec is not None, name
        rows.append(OptimizerParameter(name, default, spec.type.kind, spec.meta.label, spec.meta.help))
    from onetrainer.config.optimizers import FUSABLE_OPTIMIZERS, PER_WEIGHT_OPTIMIZERS

    # Trainer settings, not the optimizer's: never passed to its class (a class that takes them has them in its row).
    trainer_settings = [
        ("fused_back_pass", optimizer in FUSABLE_OPTIMIZERS),
        ("stochastic_rounding", optimizer in PER_WEIGHT_OPTIMIZERS),
    ]
    for name, offered in trainer_settings:
        if offered and name not in optimizer_spec(optimizer).defaults:
            spec = TrainOptimizerConfig.spec(name)
            rows.append(OptimizerParameter(name, False, "bool", spec.meta.label, spec.meta.help))
    return rows
