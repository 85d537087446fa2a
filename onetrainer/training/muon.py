"""Muon (MUON, MUON_ADV, ADAMUON_ADV): the hidden layers' matrices step with Muon, everything else with an auxiliary
Adam, as OneTrainer splits them (`MuonWithAuxAdam`, `muon_hidden_layers`, `muon_adam_regex`, the aux Adam's rates and
`muon_adam_config`).

Muon orthogonalises each weight's momentum (a few Newton-Schulz iterations): an update for the matrices of the hidden
layers. Embeddings, norms, biases and the first and last layers step with Adam. Which weights are the hidden layers is
read from their names: the method's parameter groups carry them (`param_names`, with the group's `part`), matched
against `muon_hidden_layers` or the family's own patterns (`FamilyInfo.muon_hidden_layers`).

Each parameter group becomes a Muon group (its name kept) and an Adam group (its name with "/adam"): the LR schedule,
the backups and the reported rates see both. MUON is torch's own `torch.optim.Muon` (2-D weights only) with torch's
AdamW behind one optimizer, `MuonWithAuxAdam`: one state, one state dict. adv_optm's Muons dispatch 'muon' and 'adam'
groups themselves. Both update each weight from its own gradient and state: the fused back pass can step them one
weight at a time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from onetrainer.config.optimizers import MUON_SPLIT, OptimizerSpec, aux_adam_settings, muon_patterns

if TYPE_CHECKING:
    from onetrainer.config import TrainConfig
    from onetrainer.config.optimizer_config import TrainOptimizerConfig

ADAM_SUFFIX = "/adam"


@dataclass
class MuonLayout:
    """What splits the weights: the hidden-layer patterns (regular expressions or substrings), whether the aux Adam
    takes only what Muon cannot (`aux_adam` off: every matrix is Muon's) and the aux Adam's rate per part (None: the
    group's own rate)."""

    patterns: list[str]
    regex: bool = False
    aux_adam: bool = True
    aux_rates: dict[str, float | None] = field(default_factory=dict)

    def matches(self, name: str) -> bool:
        if self.regex:
            return any(re.search(p, name) for p in self.patterns)
        return any(p in name for p in self.patterns)


def layout_of(config: TrainConfig, lr_scale: float = 1.0) -> MuonLayout:
    """The split a run's config asks for: `muon_hidden_layers` or the family's patterns; the aux Adam's rates of the
    denoiser (and other parts) and of the first and second text encoder, scaled as the groups' rates are."""
    from onetrainer.config.family_info import PartRole
    from onetrainer.config.model_types import MODEL_TYPES

    block = config.optimizer
    info = MODEL_TYPES.get(config.model_type)
    patterns = muon_patterns(block.muon_hidden_layers)
    regex = bool(block.muon_adam_regex) and bool(patterns)
    if not patterns and info is not None:
        patterns = list(info.family.muon_hidden_layers)
    rates: dict[str, float | None] = {}
    if info is not None:
        encoders = info.family.parts_with(PartRole.TEXT_ENCODER)
        for part in info.family.parts:
            rates[part] = block.muon_adam_lr
        for part, rate in zip(encoders, (block.muon_te1_adam_lr, block.muon_te2_adam_lr)):
            rates[part] = rate
    aux = block.MuonWithAuxAdam is not False  # None: the table's default (on)
    scaled = {p: (r * lr_scale if r is not None else None) for p, r in rates.items()}
    return MuonLayout(patterns, regex, aux, scaled)


def takes(spec: OptimizerSpec, param: torch.Tensor) -> bool:
    """Whether Muon can orthogonalise this weight: a matrix (two sides above 1); torch's Muon only 2-D ones, adv_optm
    flattens a convolution's kernel."""
    if sum(1 for side in param.shape if side > 1) < 2:
        return False
    return param.ndim == 2 or spec.class_path.startswith("adv_optm")


def split_groups(spec: OptimizerSpec, groups: list[dict], layout: MuonLayout) -> list[dict]:
    """Each group as a Muon group (`use_muon` True, its name) and an Adam group (False, name + "/adam"), the empty
    ones left out. A group without `param_names` (embedding vectors) is Adam's."""
    out = []
    for group in groups:
        names = group.pop("param_names", None)
        part = group.pop("part", None)
        params = group["params"]
        if names is None:
            names = [None] * len(params)
        muon, adam = [], []
        for name, param in zip(names, params, strict=True):
            is_hidden = name is not None and (not layout.aux_adam or layout.matches(name))
            (muon if is_hidden and takes(spec, param) else adam).append(param)
        base = group.get("name", f"group_{len(out)}")
        if muon:
            out.append({**group, "params": muon, "name": base, "use_muon": True})
        if adam:
            rate = layout.aux_rates.get(part) if part is not None else None
            name = f"{base}{ADAM_SUFFIX}" if muon else base
            out.append(
                {
                    **group,
                    "params": adam,
                    "name": name,
                    "use_muon": False,
                    "lr": rate if rate is not None else group["lr"],
                }
            )
    return out


class MuonWithAuxAdam(torch.optim.Optimizer):
    """torch's Muon for the groups with `use_muon`, torch's AdamW for the others: one optimizer (one `state`, one
    state dict, the groups in their order). Each step shows each of them only its current groups, so a copy of one
    weight's group (the fused back pass, stochastic rounding) steps just that weight."""

    def __init__(self, groups: list[dict], muon: dict[str, Any], adam: dict[str, Any]) -> None:
        muon_groups = [g for g in groups if g["use_muon"]]
        adam_groups = [g for g in groups if not g["use_muon"]]
        if not hasattr(torch.optim, "Muon"):
            raise RuntimeError(f"MUON needs torch.optim.Muon (torch 2.9 or newer; this is torch {torch.__version__})")
        # torch's own classes fill each group's settings in and check them (Muon: 2-D weights only).
        self._muon = torch.optim.Muon(muon_groups, **muon) if muon_groups else None
        self._adam = torch.optim.AdamW(adam_groups, **adam) if adam_groups else None
        super().__init__(groups, {})

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        groups = self.param_groups
        for inner, flag in ((self._muon, True), (self._adam, False)):
            mine = [g for g in groups if g["use_muon"] is flag]
            if not mine:
                continue
            kept = inner.param_groups
            inner.param_groups, inner.state = mine, self.state  # load_state_dict replaces the state
            try:
                inner.step()
            finally:
                inner.param_groups = kept
        return loss


def create(
    spec: OptimizerSpec, config: TrainOptimizerConfig, kwargs: dict, groups: list[dict], layout: MuonLayout | None
) -> torch.optim.Optimizer:
    """The optimizer of a Muon row: the groups split, the auxiliary Adam's settings from `muon_adam_config`."""
    if layout is None:  # built outside a run (tests, tools): the optimizer block's own patterns
        layout = MuonLayout(muon_patterns(config.muon_hidden_layers), bool(config.muon_adam_regex))
        layout.aux_adam = config.MuonWithAuxAdam is not False
    for key in MUON_SPLIT:
        kwargs.pop(key, None)
    adam, _others = aux_adam_settings(spec, config.muon_adam_config)  # unknown keys: named by the config check
    split = split_groups(spec, groups, layout)
    if spec.class_path.startswith("adv_optm"):
        import importlib

        cls = getattr(importlib.import_module("adv_optm"), spec.class_path.partition(":")[2])
        for group in split:
            group["optim_type"] = "muon" if group.pop("use_muon") else "adam"
        return cls(split, **kwargs, **_adv_adam_kwargs(adam))
    torch_adam = {
        "betas": (adam["beta1"], adam["beta2"]),
        "eps": adam["eps"],
        "weight_decay": adam["weight_decay"],
    }
    return MuonWithAuxAdam(split, kwargs, torch_adam)


def _adv_adam_kwargs(adam: dict) -> dict:
    out = {f"adam_{k}": v for k, v in adam.items() if k not in ("beta1", "beta2")}
    out["adam_betas"] = (adam["beta1"], adam["beta2"])
    return out
