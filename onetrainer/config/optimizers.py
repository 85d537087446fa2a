"""The optimizer table: each optimizer is one row of declarations, with no torch imported.

A row says where the optimizer's class lives, the parameters it takes (OneTrainer's names, with the defaults offered
for diffusion training) and a few facts (adaptive, schedule-free). Config validation reads the facts; the factory
(`onetrainer.training.optim`) builds optimizers from the rows and the GUI's "..." dialog is generated from them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from onetrainer.config.enums import Optimizer

Kwargs = dict[str, Any]


@dataclass(frozen=True)
class OptimizerSpec:
    optimizer: Optimizer
    class_path: str  # "module:Class"
    defaults: dict[str, Any]  # parameter (TrainOptimizerConfig field) -> default; also the dialog's list of keys
    package: str  # the pip package that provides it, for the message when it is missing
    adaptive: bool = False  # estimates its own step size (d): the learning rate should be about 1
    schedule_free: bool = False  # needs optimizer.train() / .eval() around sampling and saving
    warmup: str | None = None  # the constructor argument given the LR warmup's length in optimizer steps
    # The class steps one weight itself (`step_parameter(param, group, index)`) and finishes an optimizer step with
    # `step()` once every weight has stepped: the fused back pass calls these (`training/fused_back_pass.py`).
    steps_each_weight: bool = False
    # Muon: the hidden layers' matrices step with Muon, the rest with an auxiliary Adam whose settings
    # (`muon_adam_config`) are these keys, with these defaults (`onetrainer.training.muon` splits the weights).
    aux_adam: dict[str, Any] | None = None
    kwargs: Callable[[Kwargs], Kwargs] | None = field(default=None, compare=False)  # OneTrainer names -> constructor

    def constructor_kwargs(self, values: Kwargs) -> Kwargs:
        return (self.kwargs or _betas)(dict(values))

    @property
    def rounds_itself(self) -> bool:
        """The class takes `stochastic_rounding` and rounds its updates into BFLOAT_16 weights itself."""
        return "stochastic_rounding" in self.defaults


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


def _renamed(**names: str) -> Callable[[Kwargs], Kwargs]:
    """OneTrainer's names -> the class's (`decoupled_decay` is pytorch-optimizer's `weight_decouple`), then `betas`."""

    def convert(values: Kwargs) -> Kwargs:
        for ours, theirs in names.items():
            if ours in values:
                values[theirs] = values.pop(ours)
        return _betas(values)

    return convert


def _adv(values: Kwargs) -> Kwargs:
    """adv-optm: OneTrainer's `compile` is its `compiled_optimizer`; ADAMW_ADV and ADOPT_ADV take OneTrainer's beta3 as
    their AdEMAMix slow average's decay (`beta3_ema`), as OneTrainer passes it; PRODIGY_ADV's beta3 is Prodigy's own
    (its AdEMAMix decay is the `beta3_ema` setting)."""
    values = _adv_muon(values)
    if "beta3_ema" in values:
        return _two_betas(values)
    if "beta3" in values:
        values["beta3_ema"] = values.pop("beta3")
    return _betas(values)


def _adafactor(values: Kwargs) -> Kwargs:
    values["eps"] = (values.pop("eps"), values.pop("eps2"))
    return values


def _came(values: Kwargs) -> Kwargs:
    values["eps"] = (values.pop("eps"), values.pop("eps2"))
    return _betas(values)


def _adv_muon(values: Kwargs) -> Kwargs:
    """adv-optm's names (`_adv`), the betas left apart: its Muons take `beta1` as it is."""
    if "compile" in values:
        values["compiled_optimizer"] = values.pop("compile")
    return values


def _adamuon(values: Kwargs) -> Kwargs:
    return _betas(_adv_muon(values))


# The settings that decide which weights Muon trains and the auxiliary Adam's: read by the factory, never passed to
# the optimizer's class as they are.
MUON_SPLIT = ("MuonWithAuxAdam", "muon_hidden_layers", "muon_adam_regex", "muon_adam_lr", "muon_te1_adam_lr",
              "muon_te2_adam_lr", "muon_adam_config")  # fmt: skip
_MUON_SPLIT_DEFAULTS = {"MuonWithAuxAdam": True, "muon_hidden_layers": None, "muon_adam_regex": False,
                        "muon_adam_lr": None, "muon_te1_adam_lr": None, "muon_te2_adam_lr": None,
                        "muon_adam_config": {}}  # fmt: skip
# adv-optm's AdEMAMix variants, as OneTrainer passes them (off by default).
_ADV_ADEMAMIX = {"use_AdEMAMix": False, "alpha": 5.0}
_ADV_SIMPLIFIED = {"Simplified_AdEMAMix": False, "alpha_grad": 100.0}
# OneTrainer's auxiliary Adam of MUON (its `MUON_AUX_ADAM_DEFAULTS`) and of the adv_optm Muons (its ADAMW_ADV
# defaults, the keys adv_optm 2.2.3 takes as `adam_<key>`).
_MUON_AUX_ADAM = {"beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.0}
_ADV_AUX_ADAM = {"beta1": 0.9, "beta2": 0.99, "eps": 1e-8, "weight_decay": 0.0, "use_bias_correction": True,
                 "use_atan2": False, "orthogonal_gradient": False, "nnmf_factor": False, "kourkoutas_beta": False,
                 "use_AdEMAMix": False, "beta3_ema": 0.9999, "alpha": 5.0}  # fmt: skip
_ADV_MUON = {"cautious_wd": False, "weight_decay": 0.0, "accelerated_ns": False, "ns_steps": 5,
             "low_rank_ortho": False, "ortho_rank": 128, "rms_rescaling": True, "nnmf_factor": False,
             "stochastic_rounding": True, "compile": False, **_ADV_SIMPLIFIED}  # fmt: skip

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
_DECAY = {"decoupled_decay": True, "fixed_decay": False}  # pytorch-optimizer's weight_decouple / fixed_decay
# adv-optm's knobs every OneTrainer *_ADV optimizer passes (its class rounds BFLOAT_16 updates itself).
_ADV = {"cautious_wd": False, "weight_decay": 0.0, "nnmf_factor": False, "stochastic_rounding": True, "compile": False,
        "orthogonal_gradient": False}  # fmt: skip
_ADEMAMIX = {"beta1": 0.9, "beta2": 0.999, "beta3": 0.9999, "eps": 1e-8, "alpha": 5.0, "weight_decay": 1e-2}


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
              "foreach": False}, schedule_free=True, warmup="warmup_steps"),
        _row(Optimizer.SCHEDULE_FREE_SGD, "schedulefree:SGDScheduleFree", "schedulefree",
             {"momentum": 0.9, "weight_decay": 0.0, "r": 0.0, "weight_lr_power": 2.0, "foreach": False},
             schedule_free=True, warmup="warmup_steps"),
        # OneTrainer's own CAME with 8-bit first moments, written here (`onetrainer/training/came8bit.py`).
        _row(Optimizer.CAME_8BIT, "onetrainer.training.came8bit:CAME8bit", "onetrainer",
             {"eps": 1e-30, "eps2": 1e-16, "beta1": 0.9, "beta2": 0.999, "beta3": 0.9999, "weight_decay": 1e-2,
              "min_8bit_size": 16384, "quant_block_size": 2048}, kwargs=_came),
        # pytorch-optimizer (OneTrainer pins 3.6.0). OneTrainer builds AdaBelief from timm, whose `amsgrad` is
        # pytorch-optimizer's `ams_bound` (the running maximum of the variance); its other knobs are the same.
        # OneTrainer also passes Yogi `r` and `adanorm`, which Yogi in pytorch-optimizer never reads: left out.
        _row(Optimizer.ADABELIEF, "pytorch_optimizer.optimizer.adabelief:AdaBelief", "pytorch-optimizer",
             {"beta1": 0.9, "beta2": 0.999, "eps": 1e-16, "weight_decay": 0.0, "amsgrad": False, **_DECAY,
              "rectify": True, "degenerated_to_sgd": True},
             kwargs=_renamed(decoupled_decay="weight_decouple", amsgrad="ams_bound")),
        _row(Optimizer.TIGER, "pytorch_optimizer.optimizer.tiger:Tiger", "pytorch-optimizer",
             {"beta1": 0.965, "weight_decay": 0.01, **_DECAY},
             kwargs=_renamed(decoupled_decay="weight_decouple", beta1="beta")),
        _row(Optimizer.AIDA, "pytorch_optimizer.optimizer.aida:Aida", "pytorch-optimizer",
             {"beta1": 0.9, "beta2": 0.999, "k": 2, "xi": 1e-20, "weight_decay": 0.0, **_DECAY,
              "decoupled_decay": False, "rectify": False, "n_sma_threshold": 5, "degenerated_to_sgd": True,
              "ams_bound": False, "r": 0.95, "adanorm": False, "adam_debias": False, "eps": 1e-8},
             kwargs=_renamed(decoupled_decay="weight_decouple")),
        _row(Optimizer.YOGI, "pytorch_optimizer.optimizer.yogi:Yogi", "pytorch-optimizer",
             {"beta1": 0.9, "beta2": 0.999, "weight_decay": 0.0, **_DECAY, "adam_debias": False,
              "initial_accumulator": 1e-6, "eps": 1e-3},
             kwargs=_renamed(decoupled_decay="weight_decouple")),
        _row(Optimizer.ADOPT, "pytorch_optimizer.optimizer.adopt:ADOPT", "pytorch-optimizer",
             {"beta1": 0.9, "beta2": 0.9999, "weight_decay": 0.0, **_DECAY, "decoupled_decay": False, "cautious": False,
              "eps": 1e-6},
             kwargs=_renamed(decoupled_decay="weight_decouple")),
        # bitsandbytes' AdEMAMix, as OneTrainer builds it (32-bit state unless optim_bits is 8).
        _row(Optimizer.AdEMAMix, "bitsandbytes.optim:AdEMAMix", "bitsandbytes",
             {**_ADEMAMIX, "optim_bits": 32, "min_8bit_size": 4096, "is_paged": False}),
        _row(Optimizer.AdEMAMix_8BIT, "bitsandbytes.optim:AdEMAMix8bit", "bitsandbytes",
             {**_ADEMAMIX, "min_8bit_size": 4096, "is_paged": False}),
        # adv-optm 2.2.3, as OneTrainer pins it. OneTrainer gives the Kourkoutas-beta warmup the LR warmup's length.
        # Each class steps one weight at a time itself (the fused back pass).
        _row(Optimizer.ADAMW_ADV, "adv_optm:AdamW_adv", "adv-optm",
             {"beta1": 0.9, "beta2": 0.99, "eps": 1e-8, **_ADV, "use_atan2": False, "kourkoutas_beta": False,
              **_ADV_ADEMAMIX, "beta3": 0.9999},
             kwargs=_adv, warmup="k_warmup_steps", steps_each_weight=True),
        _row(Optimizer.ADOPT_ADV, "adv_optm:Adopt_adv", "adv-optm",
             {"beta1": 0.9, "beta2": 0.9999, "eps": 1e-6, **_ADV, "use_atan2": True, "kourkoutas_beta": False,
              **_ADV_ADEMAMIX, "beta3": 0.9999, **_ADV_SIMPLIFIED},
             kwargs=_adv, warmup="k_warmup_steps", steps_each_weight=True),
        _row(Optimizer.PRODIGY_ADV, "adv_optm:Prodigy_adv", "adv-optm",
             {"beta1": 0.9, "beta2": 0.99, "beta3": None, "eps": 1e-8, **_ADV, "d0": 1e-6, "d_coef": 1.0,
              "growth_rate": math.inf, "slice_p": 11, "prodigy_steps": 0, "d_limiter": False, "use_atan2": False,
              "kourkoutas_beta": False, **_ADV_ADEMAMIX, "beta3_ema": 0.9999, **_ADV_SIMPLIFIED},
             adaptive=True, kwargs=_adv, warmup="k_warmup_steps", steps_each_weight=True),
        _row(Optimizer.SIGNSGD_ADV, "adv_optm:SignSGD_adv", "adv-optm", {"momentum": 0.95, **_ADV, **_ADV_SIMPLIFIED},
             kwargs=_adv, steps_each_weight=True),
        _row(Optimizer.LION_ADV, "adv_optm:Lion_adv", "adv-optm",
             {"beta1": 0.9, "beta2": 0.99, **_ADV, "clip_threshold": 0.0, "auto_kappa_p": True}, kwargs=_adv,
             steps_each_weight=True),
        # Prodigy + schedule-free (OneTrainer pins 2.0.1): no warmup of its own (OneTrainer gives it none); with the
        # fused back pass it is told so (`fused_back_pass`: its `step()` then only finishes the step).
        _row(Optimizer.PRODIGY_PLUS_SCHEDULE_FREE, "prodigyplus.prodigy_plus_schedulefree:ProdigyPlusScheduleFree",
             "prodigy-plus-schedule-free",
             {"beta1": 0.9, "beta2": 0.99, "beta3": None, "weight_decay": 0.0, "weight_decay_by_lr": True,
              "use_bias_correction": False, "d0": 1e-6, "d_coef": 1.0, "prodigy_steps": 0, "use_speed": False,
              "eps": 1e-8, "split_groups": True, "split_groups_mean": False, "factored": True, "factored_fp32": True,
              "fused_back_pass": False, "use_stableadamw": True, "use_cautious": False, "use_grams": False,
              "use_adopt": False, "d_limiter": True, "stochastic_rounding": True, "use_schedulefree": True,
              "schedulefree_c": 0.0, "use_orthograd": False},
             adaptive=True, schedule_free=True, kwargs=_two_betas, steps_each_weight=True),
        # Muon. OneTrainer builds MUON from Keller Jordan's `muon` package (MuonWithAuxAdam); here torch's own
        # torch.optim.Muon (the same update: Nesterov momentum, 5 Newton-Schulz steps, the rate scaled by
        # sqrt(max(1, rows/columns))) with torch's AdamW for the rest, behind one optimizer (training/muon.py).
        _row(Optimizer.MUON, "onetrainer.training.muon:MuonWithAuxAdam", "torch",
             {"momentum": 0.95, "weight_decay": 0.0, "nesterov": True, "ns_steps": 5, **_MUON_SPLIT_DEFAULTS},
             aux_adam=_MUON_AUX_ADAM, kwargs=dict),
        # adv_optm 2.2.3, as OneTrainer pins it: one optimizer with 'muon' and 'adam' groups.
        _row(Optimizer.MUON_ADV, "adv_optm:Muon_adv", "adv-optm",
             {"beta1": 0.9, **_ADV_MUON, **_MUON_SPLIT_DEFAULTS, "nesterov": True, "normuon_variant": True,
              "beta2_normuon": 0.95, "orthogonal_gradient": False, "approx_mars": False},
             aux_adam=_ADV_AUX_ADAM, kwargs=_adv_muon),
        _row(Optimizer.ADAMUON_ADV, "adv_optm:AdaMuon_adv", "adv-optm",
             {"beta1": 0.95, "beta2": 0.95, "eps": 1e-8, **_ADV_MUON, **_MUON_SPLIT_DEFAULTS, "nesterov": False,
              "use_atan2": False, "normuon_variant": True, "orthogonal_gradient": False, "approx_mars": False},
             aux_adam=_ADV_AUX_ADAM, kwargs=_adamuon),
    )
}  # fmt: skip


# Optimizers whose update of a weight reads only that weight's gradient, its state and its group's settings: they can
# step one weight at a time (the fused back pass, stochastic rounding).
PER_WEIGHT_OPTIMIZERS = frozenset(
    {
        Optimizer.ADAMW,
        Optimizer.ADAM,
        Optimizer.SGD,
        Optimizer.ADAGRAD,
        Optimizer.RMSPROP,
        Optimizer.ADAFACTOR,
        Optimizer.CAME,
        Optimizer.LION,
        Optimizer.MUON,  # each matrix is orthogonalised on its own
        Optimizer.MUON_ADV,
        Optimizer.ADAMUON_ADV,
    }
)
# The optimizers the fused back pass can step: the per-weight ones (shown one weight at a time) and those that step
# one weight themselves.
FUSABLE_OPTIMIZERS = PER_WEIGHT_OPTIMIZERS | {o for o, row in OPTIMIZERS.items() if row.steps_each_weight}
# The optimizers that round updates into BFLOAT_16 weights stochastically: those this trainer steps in float32 a few
# weights at a time (`training/stochastic_rounding.py`) and those whose class rounds itself.
ROUNDING_OPTIMIZERS = PER_WEIGHT_OPTIMIZERS | {o for o, row in OPTIMIZERS.items() if row.rounds_itself}


# -- Muon's split, read without torch (the config checks) --------------------------------------------------------------


def muon_patterns(text: str | None) -> list[str]:
    """The hidden-layer patterns of `muon_hidden_layers` (comma-separated; empty: none given)."""
    return [p.strip() for p in (text or "").split(",") if p.strip()]


def muon_pattern_problem(text: str | None, regex: bool) -> str | None:
    """Why `muon_hidden_layers` cannot be used as given (a regular expression that does not compile), or None."""
    if not regex:
        return None
    import re

    for pattern in muon_patterns(text):
        try:
            re.compile(pattern)
        except re.error as e:
            return f"'{pattern}' is not a regular expression ({e})"
    return None


def aux_adam_settings(spec: OptimizerSpec, given: dict | None) -> tuple[dict[str, Any], list[str]]:
    """The auxiliary Adam's settings: the row's defaults, overridden by the non-null ones of `muon_adam_config`; and
    the other keys given (OneTrainer writes its whole optimizer block there: the config check names those that are
    no optimizer setting at all)."""
    values = dict(spec.aux_adam or {})
    others = []
    for key, value in (given or {}).items():
        if key in values:
            if value is not None:
                values[key] = value
        else:
            others.append(key)
    return values, others
