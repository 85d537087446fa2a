"""The optimizer table and the factory built on it.

Each optimizer is one table row: where its class lives, the parameters it takes (OneTrainer's names, with the
defaults offered for diffusion training) and a few facts (adaptive, schedule-free). The GUI's "..." dialog is generated
from the same rows; each parameter's label and tooltip come from its declaration in `TrainOptimizerConfig`. The user's
last settings per optimizer live in the config's `optimizer_defaults`.
"""

from __future__ import annotations

import copy
import importlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from onetrainer.config.enums import Optimizer
from onetrainer.config.optimizer_config import TrainOptimizerConfig

if TYPE_CHECKING:
    from onetrainer.config import TrainConfig

Kwargs = dict[str, Any]


@dataclass(frozen=True)
class OptimizerSpec:
    optimizer: Optimizer
    class_path: str  # "module:Class"
    defaults: dict[str, Any]  # parameter (TrainOptimizerConfig field) -> default; also the dialog's list of keys
    package: str  # the pip package that provides it, for the message when it is missing
    adaptive: bool = False  # estimates its own step size (d): the learning rate should be about 1
    schedule_free: bool = False  # needs optimizer.train() / .eval() around sampling and saving
    kwargs: Callable[[Kwargs], Kwargs] | None = field(default=None, compare=False)  # OneTrainer names -> constructor

    def constructor_kwargs(self, values: Kwargs) -> Kwargs:
        return (self.kwargs or _betas)(dict(values))


def _betas(values: Kwargs) -> Kwargs:
    """OneTrainer's beta1 / beta2 (/ beta3) become the `betas` tuple most optimizers take."""
    names = [n for n in ("beta1", "beta2", "beta3") if n in values]
    if names:
        values["betas"] = tuple(values.pop(n) for n in names)
    return values


def _two_betas(values: Kwargs) -> Kwargs:
    """Prodigy: betas for the moments, beta3 on its own."""
    beta3 = values.pop("beta3", None)
    values = _betas(values)
    values["beta3"] = beta3
    return values


def _adafactor(values: Kwargs) -> Kwargs:
    values["eps"] = (values.pop("eps"), values.pop("eps2"))
    return values


def _came(values: Kwargs) -> Kwargs:
    values["eps"] = (values.pop("eps"), values.pop("eps2"))
    return _betas(values)


_TORCH_ADAM = {
    "beta1": 0.9,
    "beta2": 0.999,
    "eps": 1e-8,
    "weight_decay": 0.0,
    "amsgrad": False,
    "foreach": False,
    "maximize": False,
    "capturable": False,
    "differentiable": False,
    "fused": False,
}
_BNB_ADAM = {"beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.0, "amsgrad": False, "min_8bit_size": 4096}
_SGD = {"momentum": 0.0, "dampening": 0.0, "weight_decay": 0.0, "nesterov": False}
_ADAGRAD = {"lr_decay": 0.0, "weight_decay": 0.0, "initial_accumulator_value": 0.0, "eps": 1e-10}
_RMSPROP = {"alpha": 0.99, "eps": 1e-8, "weight_decay": 0.0, "momentum": 0.0, "centered": False}
_LAMB = {"bias_correction": True, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.0, "amsgrad": False,
         "adam_w_mode": True, "max_unorm": 1.0, "min_8bit_size": 4096}  # fmt: skip
_LARS = {**_SGD, "momentum": 0.9, "max_unorm": 0.02, "min_8bit_size": 4096}
_DADAPT = {"d0": 1e-6, "growth_rate": math.inf, "log_every": 0}


def _row(optimizer: Optimizer, path: str, package: str, defaults: dict, **facts) -> OptimizerSpec:
    return OptimizerSpec(optimizer, path, defaults, package, **facts)


OPTIMIZERS: dict[Optimizer, OptimizerSpec] = {
    row.optimizer: row
    for row in (
        _row(Optimizer.ADAMW, "torch.optim:AdamW", "torch", {**_TORCH_ADAM, "weight_decay": 1e-2}),
        _row(Optimizer.ADAM, "torch.optim:Adam", "torch", dict(_TORCH_ADAM)),
        _row(Optimizer.SGD, "torch.optim:SGD", "torch", {**_SGD, "foreach": False, "maximize": False}),
        _row(Optimizer.ADAGRAD, "torch.optim:Adagrad", "torch", {**_ADAGRAD, "foreach": False, "maximize": False}),
        _row(Optimizer.RMSPROP, "torch.optim:RMSprop", "torch", {**_RMSPROP, "foreach": False, "maximize": False}),
        _row(Optimizer.ADAMW_8BIT, "bitsandbytes.optim:AdamW8bit", "bitsandbytes",
             {**_BNB_ADAM, "weight_decay": 1e-2, "is_paged": False}),
        _row(Optimizer.ADAM_8BIT, "bitsandbytes.optim:Adam8bit", "bitsandbytes", {**_BNB_ADAM, "is_paged": False}),
        # bitsandbytes' 8-bit SGD and LARS keep 8-bit momentum, so they need some.
        _row(Optimizer.SGD_8BIT, "bitsandbytes.optim:SGD8bit", "bitsandbytes",
             {**_SGD, "momentum": 0.9, "min_8bit_size": 4096}),
        _row(Optimizer.ADAGRAD_8BIT, "bitsandbytes.optim:Adagrad8bit", "bitsandbytes",
             {**_ADAGRAD, "min_8bit_size": 4096}),
        _row(Optimizer.RMSPROP_8BIT, "bitsandbytes.optim:RMSprop8bit", "bitsandbytes",
             {**_RMSPROP, "min_8bit_size": 4096}),
        _row(Optimizer.LAMB, "bitsandbytes.optim:LAMB", "bitsandbytes", dict(_LAMB)),
        _row(Optimizer.LAMB_8BIT, "bitsandbytes.optim:LAMB8bit", "bitsandbytes", dict(_LAMB)),
        _row(Optimizer.LARS, "bitsandbytes.optim:LARS", "bitsandbytes", dict(_LARS)),
        _row(Optimizer.LARS_8BIT, "bitsandbytes.optim:LARS8bit", "bitsandbytes", dict(_LARS)),
        _row(Optimizer.LION, "lion_pytorch:Lion", "lion-pytorch",
             {"beta1": 0.9, "beta2": 0.99, "weight_decay": 0.0, "use_triton": False}),
        _row(Optimizer.LION_8BIT, "bitsandbytes.optim:Lion8bit", "bitsandbytes",
             {"beta1": 0.9, "beta2": 0.99, "weight_decay": 0.0, "min_8bit_size": 4096, "is_paged": False}),
        _row(Optimizer.PRODIGY, "prodigyopt:Prodigy", "prodigyopt",
             {"beta1": 0.9, "beta2": 0.999, "beta3": None, "eps": 1e-8, "weight_decay": 0.0, "decouple": True,
              "use_bias_correction": False, "safeguard_warmup": False, "d0": 1e-6, "d_coef": 1.0,
              "growth_rate": math.inf, "fsdp_in_use": False, "slice_p": 11},
             adaptive=True, kwargs=_two_betas),
        _row(Optimizer.DADAPT_ADAM, "dadaptation:DAdaptAdam", "dadaptation",
             {"beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.0, "decouple": False,
              "use_bias_correction": False, "fsdp_in_use": False, **_DADAPT}, adaptive=True),
        _row(Optimizer.DADAPT_ADAN, "dadaptation:DAdaptAdan", "dadaptation",
             {"beta1": 0.98, "beta2": 0.92, "beta3": 0.99, "eps": 1e-8, "weight_decay": 0.02, "no_prox": False,
              **_DADAPT}, adaptive=True),
        _row(Optimizer.DADAPT_ADA_GRAD, "dadaptation:DAdaptAdaGrad", "dadaptation",
             {"momentum": 0.0, "weight_decay": 0.0, "eps": 1e-6, **_DADAPT}, adaptive=True),
        _row(Optimizer.DADAPT_LION, "dadaptation:DAdaptLion", "dadaptation",
             {"beta1": 0.9, "beta2": 0.99, "weight_decay": 0.0, "fsdp_in_use": False, "d0": 1e-6, "log_every": 0},
             adaptive=True),
        _row(Optimizer.DADAPT_SGD, "dadaptation:DAdaptSGD", "dadaptation",
             {"momentum": 0.0, "weight_decay": 0.0, "fsdp_in_use": False, **_DADAPT}, adaptive=True),
        _row(Optimizer.ADAFACTOR, "transformers.optimization:Adafactor", "transformers",
             {"eps": 1e-30, "eps2": 1e-3, "clip_threshold": 1.0, "decay_rate": -0.8, "beta1": None,
              "weight_decay": 0.0, "scale_parameter": False, "relative_step": False, "warmup_init": False},
             kwargs=_adafactor),
        _row(Optimizer.CAME, "came_pytorch:CAME", "came-pytorch",
             {"eps": 1e-30, "eps2": 1e-16, "clip_threshold": 1.0, "beta1": 0.9, "beta2": 0.999, "beta3": 0.9999,
              "weight_decay": 1e-2}, kwargs=_came),
        _row(Optimizer.SCHEDULE_FREE_ADAMW, "schedulefree:AdamWScheduleFree", "schedulefree",
             {"beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 1e-2, "r": 0.0, "weight_lr_power": 2.0,
              "foreach": False}, schedule_free=True),
        _row(Optimizer.SCHEDULE_FREE_SGD, "schedulefree:SGDScheduleFree", "schedulefree",
             {"momentum": 0.9, "weight_decay": 0.0, "r": 0.0, "weight_lr_power": 2.0, "foreach": False},
             schedule_free=True),
    )
}  # fmt: skip


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
    config: TrainOptimizerConfig, param_groups: list[dict], learning_rate: float, warmup_steps: int = 0
):
    """Build the optimizer for named parameter groups (each group dict has "params", "lr" and "name")."""
    spec = optimizer_spec(config.optimizer)
    module_name, _, class_name = spec.class_path.partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except ImportError as e:
        raise RuntimeError(
            f"the optimizer {spec.optimizer.value} needs the package '{spec.package}', which cannot be imported "
            f"here ({e}); install it or choose another optimizer"
        ) from None
    kwargs = spec.constructor_kwargs(resolved_parameters(config))
    if spec.optimizer is Optimizer.ADAFACTOR and kwargs.get("relative_step"):
        # Adaptive mode: Adafactor computes the step size from the step count; it must not be given one.
        for group in param_groups:
            group.pop("lr", None)
        return cls(param_groups, lr=None, **kwargs)
    if spec.schedule_free:
        kwargs["warmup_steps"] = warmup_steps  # schedule-free optimizers warm up themselves
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
        lr = float(lr)
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
        setattr(block, name, value)
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
    for name, default in optimizer_spec(optimizer).defaults.items():
        spec = TrainOptimizerConfig.spec(name)
        assert spec is not None, name
        rows.append(OptimizerParameter(name, default, spec.type.kind, spec.meta.label, spec.meta.help))
    return rows
