"""The adapter kinds a LoRA run can train: LoRA, DoRA, LoHa, LoKr and OFT v2, chosen with OneTrainer's settings.

LoRA, LoHa, LoKr and OFT are peft's layers (`inject_adapter_in_model`). DoRA is our own layer: OneTrainer and
AUTOMATIC1111 keep the magnitude per *input column* (`dora_scale` of shape `[1, in]`) unless
`lora_decompose_output_axis` is on, while peft's DoRA keeps it per output row, which no conversion turns into the
default. Every kind names its state like peft (`<module>.<weight name>`), so backups, continuing and the file
formats (`weights/lycoris_keys.py`) treat them alike.

Two of OneTrainer's options extend peft's layers in place: `lokr_weight_decompose` puts DoRA's weight decomposition
on top of LoKr (a `dora_scale` per output row with `lokr_dora_on_output`, LyCORIS's default, else per input column),
and `oft_scaled` is Scaled OFT: the trained block parameters are divided by 2·√(block size − 1) before Cayley's
transform, and a `scaled_oft` marker is saved beside them so that loaders know.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from onetrainer.config.enums import PeftType
from onetrainer.weights.adapter_kinds import DORA, LOHA, LOKR, LORA, OFT

if TYPE_CHECKING:
    from onetrainer.config import TrainConfig

# The substrings that mark an adapter's parameters (and state keys) for each kind.
MARKERS = {
    LORA: ("lora_",),
    DORA: ("lora_", "dora_scale"),
    LOHA: ("hada_",),
    LOKR: ("lokr_", "dora_scale"),
    OFT: ("oft_",),
}
KIND_LABELS = {LORA: "LoRA", DORA: "DoRA", LOHA: "LoHa", LOKR: "LoKr", OFT: "OFT v2"}


def adapter_kind(config: TrainConfig) -> str:
    """The adapter kind the config asks for."""
    if config.peft_type is PeftType.LOHA:
        return LOHA
    if config.peft_type is PeftType.LOKR:
        return LOKR
    if config.peft_type is PeftType.OFT_2:
        return OFT
    return DORA if config.lora_decompose else LORA


def is_adapter_name(kind: str, name: str) -> bool:
    return any(marker in name for marker in MARKERS[kind])


def full_lokr_rank(module: torch.nn.Module) -> int:
    """A LoKr rank at which peft keeps both Kronecker factors full (its test is rank >= half the larger side)."""
    weight = module.weight
    return max(int(weight.shape[0]), int(weight.shape[1]))


def inject(
    kind: str,
    config: TrainConfig,
    module: torch.nn.Module,
    targets: list[str],
    ranks: dict[str, int],
    alphas: dict[str, float],
    lokr_structure: dict | None = None,
) -> None:
    """Wrap each target module of `module` in an adapter of `kind` (ranks and alphas per module path)."""
    if kind == DORA:
        for name in targets:
            _wrap_dora(module, name, ranks[name], alphas[name], config)
        return
    from peft import inject_adapter_in_model

    base_rank = max(set(ranks.values()), key=list(ranks.values()).count)
    base_alpha = max(set(alphas.values()), key=list(alphas.values()).count)
    common = {
        "target_modules": targets,
        "rank_pattern": {f"^{k}$": v for k, v in ranks.items() if v != base_rank},
        "alpha_pattern": {f"^{k}$": v for k, v in alphas.items() if v != base_alpha},
    }
    inject_adapter_in_model(_peft_config(kind, config, base_rank, base_alpha, common, lokr_structure), module)
    for name in targets:
        layer = module.get_submodule(name)
        _plain_adapter_layers(layer)
        if kind == LOKR and config.lokr_weight_decompose:
            _decompose_lokr(layer, config.lokr_dora_on_output, config.dropout_probability)
        if kind == OFT and config.oft_scaled:
            _scale_oft(layer)


def _plain_adapter_layers(layer: torch.nn.Module) -> None:
    """Make the adapter's own layers plain torch layers. peft builds a convolution's LoRA down and up layers as
    `type(base_layer)`: over a quantized convolution (`precision/quantize.py`) they would be a frozen 8-bit class
    without its scale (INT_8, the W8A8 kinds: an AttributeError at the first step) or a float8 class whose backward pass
    gives its own weight no gradient (FLOAT_8: the convolutions' LoRA never trains)."""
    inside_base = {id(m) for m in layer.get_base_layer().modules()}
    for sub in layer.modules():
        if (
            isinstance(sub, _ADAPTER_LAYER_CLASSES)
            and type(sub) not in _ADAPTER_LAYER_CLASSES
            and id(sub) not in inside_base
        ):
            sub.__class__ = next(cls for cls in type(sub).__mro__ if cls in _ADAPTER_LAYER_CLASSES)


_ADAPTER_LAYER_CLASSES = (torch.nn.Linear, torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)


def _peft_config(kind: str, config: TrainConfig, rank: int, alpha: float, common: dict, lokr_structure: dict | None):
    from peft import LoHaConfig, LoKrConfig, LoraConfig, OFTConfig

    dropout = config.dropout_probability
    if kind == LORA:
        return LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout, init_lora_weights=True, **common)
    if kind == LOHA:
        return LoHaConfig(r=rank, alpha=alpha, rank_dropout=dropout, init_weights=True, **common)
    if kind == LOKR:
        structure = lokr_structure or {}
        return LoKrConfig(
            r=rank,
            alpha=alpha,
            rank_dropout=0.0 if config.lokr_weight_decompose else dropout,  # decomposed: dropout on the input instead
            decompose_both=structure.get("decompose_both", config.lokr_decompose_both),
            decompose_factor=structure.get("decompose_factor", config.lokr_decompose_factor),
            use_effective_conv2d=structure.get("use_tucker", config.lokr_use_tucker),
            init_weights=True,
            **common,
        )
    # OFT v2: peft's, which rotates the input side in blocks of `oft_block_size`; it has no alpha.
    common = {k: v for k, v in common.items() if k == "target_modules"}
    return OFTConfig(
        r=0,
        oft_block_size=config.oft_block_size,
        block_share=config.oft_block_share,
        module_dropout=dropout,
        init_weights=True,
        **common,
    )


def adapter_layers(module: torch.nn.Module) -> list[torch.nn.Module]:
    """The adapter layers inside `module` (peft's tuner layers and our DoRA layers)."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    return [m for m in module.modules() if isinstance(m, BaseTunerLayer | DoraLayer)]


def adapter_state(kind: str, module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The adapter weights of one part under peft-style names (`<module>.<weight>`), on the CPU."""
    if kind == DORA:
        state = {}
        for name, layer in module.named_modules():
            if isinstance(layer, DoraLayer):
                for key, value in layer.adapter_tensors().items():
                    state[f"{name}.{key}"] = value
    else:
        from peft import get_peft_model_state_dict

        state = get_peft_model_state_dict(module)
        if kind == LOKR:
            state.update(_decomposition_state(module))
    return {k: v.detach().to("cpu") for k, v in state.items()}


def load_adapter_state(kind: str, module: torch.nn.Module, state: dict[str, torch.Tensor]) -> list[str]:
    """Load `adapter_state`'s names into the part; returns the keys that fit no adapter weight, or the first
    mismatching shape."""
    if kind != DORA:
        from peft import set_peft_model_state_dict

        mine = {k for k in adapter_state(kind, module)}
        given = set(state)
        problems = []
        if kind == LOKR:
            state, problems = _load_decomposition_state(module, state)
        result = set_peft_model_state_dict(module, state)
        unexpected = [k for k in getattr(result, "unexpected_keys", []) if is_adapter_name(kind, k)]
        return problems + unexpected + sorted(mine - given)
    layers = {name: layer for name, layer in module.named_modules() if isinstance(layer, DoraLayer)}
    problems = []
    for key, value in state.items():
        for suffix in DoraLayer.STATE_KEYS:
            if key.endswith("." + suffix) and key[: -len(suffix) - 1] in layers:
                target = layers[key[: -len(suffix) - 1]].tensor(suffix)
                if target.shape != value.shape:
                    problems.append(f"{key} {tuple(value.shape)} ≠ {tuple(target.shape)}")
                else:
                    with torch.no_grad():
                        target.copy_(value)
                break
        else:
            problems.append(key)
    return problems


# -- DoRA ---------------------------------------------------------------------------------------------------------


class DoraLayer(torch.nn.Module):
    """LoRA with weight decomposition (DoRA) as OneTrainer and AUTOMATIC1111 define it.

    W' = m · (W + s·B·A) / ‖W + s·B·A‖ with s = alpha / rank. The norm runs over each input column (all outputs)
    by default, so m has shape [1, in, (1, 1)]; over each output row with the output axis, so m is [out, 1, (1, 1)].
    The norm is a constant for backpropagation (section 4.3 of the DoRA paper, as OneTrainer does).
    """

    STATE_KEYS = ("lora_A.weight", "lora_B.weight", "dora_scale")

    def __init__(self, base: torch.nn.Module, rank: int, alpha: float, dropout: float, output_axis: bool, eps: bool):
        super().__init__()
        self.base_layer = base
        self.rank, self.alpha, self.output_axis, self.use_eps = rank, alpha, output_axis, eps
        self._disable_adapters = False
        weight = base.weight
        factory = {"device": weight.device, "dtype": torch.float32}
        if isinstance(base, torch.nn.Conv2d):
            self.lora_A = torch.nn.Conv2d(
                base.in_channels, rank, base.kernel_size, base.stride, base.padding, bias=False, **factory
            )
            self.lora_B = torch.nn.Conv2d(rank, base.out_channels, 1, bias=False, **factory)
        else:
            self.lora_A = torch.nn.Linear(base.in_features, rank, bias=False, **factory)
            self.lora_B = torch.nn.Linear(rank, base.out_features, bias=False, **factory)
        torch.nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5))
        torch.nn.init.zeros_(self.lora_B.weight)
        self.dropout = torch.nn.Dropout(dropout) if dropout > 0 else torch.nn.Identity()
        with torch.no_grad():
            self.dora_scale = torch.nn.Parameter(self._norm(weight.float()))

    def __getattr__(self, name: str):
        # Code that reads the wrapped layer's attributes (`in_features`, `weight`…) still finds them, as with peft.
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name == "base_layer":
                raise
            return getattr(self.base_layer, name)

    def _norm(self, weight: torch.Tensor) -> torch.Tensor:
        if self.output_axis:
            dims = tuple(range(1, weight.dim()))
        else:
            dims = (0, *range(2, weight.dim()))
        norm = torch.linalg.vector_norm(weight, dim=dims, keepdim=True)
        return norm + torch.finfo(weight.dtype).eps if self.use_eps else norm

    def delta(self) -> torch.Tensor:
        """s·B·A shaped like the base weight."""
        weight = self.base_layer.weight
        down, up = self.lora_A.weight, self.lora_B.weight
        product = up.flatten(1) @ down.flatten(1)
        return product.reshape(weight.shape) * (self.alpha / self.rank)

    def merged_weight(self) -> torch.Tensor:
        adapted = self.base_layer.weight.to(self.lora_A.weight.dtype) + self.delta()
        return self.dora_scale * (adapted / self._norm(adapted.detach()))

    def forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        base = self.base_layer
        if self._disable_adapters:
            return base(x, *args, **kwargs)
        weight = self.merged_weight().to(x.dtype)
        x = self.dropout(x)
        if isinstance(base, torch.nn.Conv2d):
            return F.conv2d(x, weight, base.bias, base.stride, base.padding, base.dilation, base.groups)
        return F.linear(x, weight, base.bias)

    def tensor(self, key: str) -> torch.Tensor:
        return {
            "lora_A.weight": self.lora_A.weight,
            "lora_B.weight": self.lora_B.weight,
            "dora_scale": self.dora_scale,
        }[key]

    def adapter_tensors(self) -> dict[str, torch.Tensor]:
        return {key: self.tensor(key) for key in self.STATE_KEYS}


def _wrap_dora(module: torch.nn.Module, name: str, rank: int, alpha: float, config: TrainConfig) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = module.get_submodule(parent_name) if parent_name else module
    base = getattr(parent, child)
    if isinstance(base, torch.nn.Conv2d) and base.groups != 1:
        raise ValueError(f"DoRA cannot wrap the grouped convolution {name}")
    layer = DoraLayer(
        base,
        rank,
        alpha,
        config.dropout_probability,
        config.lora_decompose_output_axis,
        config.lora_decompose_norm_epsilon,
    )
    setattr(parent, child, layer)


def iter_adapter_params(kind: str, module: torch.nn.Module) -> Iterator[tuple[str, torch.nn.Parameter]]:
    for name, param in module.named_parameters():
        if is_adapter_name(kind, name):
            yield name, param


# -- LoKr with weight decomposition, Scaled OFT ----------------------------------------------------------------------


def _decompose_lokr(layer: torch.nn.Module, on_output: bool, dropout: float) -> None:
    """DoRA on a peft LoKr layer, as OneTrainer and LyCORIS define it: W' = m · (W + ΔW) / ‖W + ΔW‖, the norm per
    output row (`on_output`) or per input column, a constant for backpropagation; dropout acts on the input."""
    weight = layer.get_base_layer().weight
    layer.dora_on_output = on_output
    layer.dora_dropout = torch.nn.Dropout(dropout) if dropout > 0 else torch.nn.Identity()
    with torch.no_grad():
        layer.dora_scale = torch.nn.Parameter(_axis_norm(weight.detach().float(), on_output))
    layer.forward = _decomposed_lokr_forward.__get__(layer)


def _axis_norm(weight: torch.Tensor, on_output: bool) -> torch.Tensor:
    dims = tuple(range(1, weight.dim())) if on_output else (0, *range(2, weight.dim()))
    return torch.linalg.vector_norm(weight, dim=dims, keepdim=True) + torch.finfo(weight.dtype).eps


def _decomposed_lokr_forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    base = self.get_base_layer()
    if self.disable_adapters or not self.active_adapters:
        return base(x, *args, **kwargs)
    delta = self.get_delta_weight(self.active_adapters[0])
    adapted = base.weight.to(delta.dtype) + delta
    weight = (self.dora_scale * (adapted / _axis_norm(adapted.detach(), self.dora_on_output))).to(x.dtype)
    x = self.dora_dropout(x)
    if isinstance(base, torch.nn.Conv2d):
        return F.conv2d(x, weight, base.bias, base.stride, base.padding, base.dilation, base.groups)
    return F.linear(x, weight, base.bias)


def _decomposition_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {f"{name}.dora_scale": layer.dora_scale for name, layer in module.named_modules() if _is_decomposed(layer)}


def _is_decomposed(layer: torch.nn.Module) -> bool:
    return isinstance(getattr(layer, "dora_scale", None), torch.nn.Parameter) and not isinstance(layer, DoraLayer)


def _load_decomposition_state(
    module: torch.nn.Module, state: dict[str, torch.Tensor]
) -> tuple[dict[str, torch.Tensor], list[str]]:
    """Copy the `dora_scale` entries into the decomposed LoKr layers; the rest is for peft."""
    rest, problems = {}, []
    for key, value in state.items():
        if not key.endswith(".dora_scale"):
            rest[key] = value
            continue
        layer = module.get_submodule(key[: -len(".dora_scale")])
        if not _is_decomposed(layer):
            problems.append(f"{key} (the file was trained with lokr_weight_decompose on)")
        elif layer.dora_scale.shape != value.shape:
            axis = "output rows" if layer.dora_on_output else "input columns"
            problems.append(f"{key} {tuple(value.shape)} (lokr_dora_on_output: this run keeps it per {axis})")
        else:
            with torch.no_grad():
                layer.dora_scale.copy_(value)
    return rest, problems


def _scale_oft(layer: torch.nn.Module) -> None:
    """Scaled OFT (OneTrainer's `oft_scaled`): Cayley's transform takes the parameters / 2·√(block size − 1)."""
    for rotation in layer.oft_R.values():
        factor = 2 * math.sqrt(rotation.block_size - 1)
        cayley = rotation._cayley_batch

        def scaled_cayley(q: torch.Tensor, *args, _cayley=cayley, _factor=factor, **kwargs) -> torch.Tensor:
            return _cayley(q / _factor, *args, **kwargs)

        rotation._cayley_batch = scaled_cayley
        rotation.register_buffer("scaled_oft", torch.tensor(True))
