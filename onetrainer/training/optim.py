"""The optimizer table and the factory built on it.

Each optimizer is one table row: where its class lives, the parameters it takes (OneTrainer's names, with the
optimizer's defaults) and a few facts (adaptive, schedule-free). The GUI's "..." dialog is generated from the same
rows; a parameter's label and tooltip come from its declaration in `TrainOptimizerConfig`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from onetrainer.config.enums import Optimizer
from onetrainer.config.optimizer_config import TrainOptimizerConfig


@dataclass(frozen=True)
class OptimizerSpec:
    optimizer: Optimizer
    class_path: str  # "module:Class"
    defaults: dict[str, Any]  # parameter (TrainOptimizerConfig field name) -> default; also the dialog's key list
    package: str  # the pip package that provides it, for the error message when it is missing
    adaptive: bool = False  # learns its own step size: report lr x d
    schedule_free: bool = False  # needs optimizer.train() / .eval() around sampling and saving
    cuda_only: bool = False
    kwargs: Callable[[dict[str, Any]], dict[str, Any]] | None = field(default=None, compare=False)

    def constructor_kwargs(self, values: dict[str, Any]) -> dict[str, Any]:
        return self.kwargs(values) if self.kwargs else _betas(values)


def _betas(values: dict[str, Any]) -> dict[str, Any]:
    """OneTrainer's beta1/beta2(/beta3) become the `betas` tuple most optimizers take."""
    out = dict(values)
    names = [n for n in ("beta1", "beta2", "beta3") if n in out]
    if names:
        betas = tuple(out.pop(n) for n in names)
        out["betas"] = betas
    return out


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
_BNB_8BIT = {"min_8bit_size": 4096, "percentile_clipping": 100, "block_wise": True, "is_paged": False}

OPTIMIZERS: dict[Optimizer, OptimizerSpec] = {
    spec.optimizer: spec
    for spec in (
        OptimizerSpec(Optimizer.ADAMW, "torch.optim:AdamW", {**_TORCH_ADAM, "weight_decay": 1e-2}, "torch"),
        OptimizerSpec(Optimizer.ADAM, "torch.optim:Adam", dict(_TORCH_ADAM), "torch"),
        OptimizerSpec(
            Optimizer.SGD,
            "torch.optim:SGD",
            {"momentum": 0.0, "dampening": 0.0, "weight_decay": 0.0, "nesterov": False, "foreach": False,
             "maximize": False, "differentiable": False},
            "torch",
        ),
        OptimizerSpec(
            Optimizer.ADAMW_8BIT,
            "bitsandbytes.optim:AdamW8bit",
            {"beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 1e-2, "amsgrad": False, **_BNB_8BIT},
            "bitsandbytes",
            kwargs=lambda v: _betas({k: x for k, x in v.items() if k != "is_paged"}),
        ),
    )
}  # fmt: skip


def optimizer_spec(optimizer: Optimizer) -> OptimizerSpec:
    spec = OPTIMIZERS.get(optimizer)
    if spec is None:
        raise NotImplementedError(f"the optimizer {optimizer.value} is not available yet; use ADAMW or ADAMW_8BIT")
    return spec


def resolved_parameters(config: TrainOptimizerConfig) -> dict[str, Any]:
    """The table's defaults for the chosen optimizer, overridden by every parameter the user set (non-null)."""
    spec = optimizer_spec(config.optimizer)
    return {
        name: (getattr(config, name) if getattr(config, name) is not None else d) for name, d in spec.defaults.items()
    }


def create_optimizer(config: TrainOptimizerConfig, param_groups: list[dict[str, Any]], learning_rate: float):
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
    return cls(param_groups, lr=learning_rate, **kwargs)


def effective_learning_rates(optimizer) -> dict[str, float]:
    """The current rate of each named group; adaptive optimizers report lr x d, the rate they really use."""
    rates: dict[str, float] = {}
    for i, group in enumerate(optimizer.param_groups):
        name = str(group.get("name", f"group_{i}"))
        lr = float(group.get("lr", 0.0))
        if "d" in group and group["d"] is not None:
            lr *= float(group["d"])
        rates[name] = lr
    return rates
