"""`scripts/lora_tool.py extract`: a LoRA from a fine-tune and its base model.

Both models load through their family (any source a run reads: a diffusers folder, a single file, a hub id), in
float32. For every Linear and Conv2d layer of the parts a LoRA adapts (the denoiser and the text encoders) whose
weight changed, the change ΔW (convolutions flattened over their kernel) is factored by SVD at the rank asked for (or
the smallest rank keeping an energy share of it) into a LoRA module with alpha = rank (scale 1), and the share of
ΔW's Σσ² each keeps is reported. What a LoRA cannot hold (changed biases and norms) is counted and reported. The file
is written in the family's kohya layout or in diffusers' names, as a trained LoRA would be.

A change no larger than the output dtype's rounding is noise, not training: a model saved in half precision (a merge
written in FLOAT_16) differs from its float32 base in every weight by up to half a step of that dtype. Such layers are
left out and counted by part (`within_rounding`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from onetrainer.config import ModelFormat, ModelType, TrainingMethod
from onetrainer.config.enums import DataType
from onetrainer.weights import diffusers_lora
from onetrainer.weights.metadata import LORA_TOOL_KEY

LORA_FORMATS = (ModelFormat.KOHYA_LORA, ModelFormat.DIFFUSERS_LORA)


class ExtractError(Exception):
    """The extraction cannot be done; the message names the model or the setting."""


@dataclass(frozen=True)
class Extraction:
    model_type: ModelType
    base_model_name: str
    tuned_model_name: str
    destination: Path
    output_format: ModelFormat = ModelFormat.KOHYA_LORA
    rank: int | None = None
    energy: float | None = None
    output_dtype: DataType = DataType.FLOAT_16
    overwrite: bool = False
    transformer_model_name: str = ""  # the base model's transformer from a file of its own (`transformer.model_name`)

    @property
    def tuned_is_transformer(self) -> bool:
        """Whether the fine-tune is a file holding the transformer alone (as a merge writes it for these families),
        read over the base model's other parts."""
        return holds_transformer_alone(self.model_type) and Path(self.tuned_model_name).expanduser().is_file()

    def problems(self) -> list[str]:
        out = []
        if (self.rank is None) == (self.energy is None):
            out.append("extract takes --rank or --energy")
        if self.output_format not in LORA_FORMATS:
            out.append(
                f"--output-model-format {self.output_format.value}: a LoRA is saved as KOHYA_LORA or DIFFUSERS_LORA"
            )
        destination = self.destination.expanduser()
        if destination.exists() and not self.overwrite:
            out.append(f"{destination} exists; add --overwrite to replace it")
        return out


def holds_transformer_alone(model_type: ModelType) -> bool:
    """Whether the family's single files hold the transformer alone: it reads one as the transformer's own model
    (`transformer.model_name`) over a diffusers base, never as the base model."""
    from onetrainer.config.model_types import OWN_MODEL, model_type_info

    return OWN_MODEL in model_type_info(model_type).family.part_capabilities.get("transformer", ())


@dataclass(frozen=True)
class LayerReport:
    part: str
    module: str
    rank: int
    kept_energy: float


@dataclass(frozen=True)
class Extracted:
    path: Path
    layers: list[LayerReport]
    left_out: int  # changed biases and norms: a LoRA holds weight changes only
    rounding: dict[str, int]  # {part: layers whose change is within the output dtype's rounding}, left out


def within_rounding(base: torch.Tensor, tuned: torch.Tensor, dtype: torch.dtype) -> bool:
    """Whether no element of `tuned` differs from `base` by more than one step of `dtype` at that value (the spacing
    of its representable numbers there; below its normal range, the subnormal spacing).

    Elementwise, not by norm: one trained element beyond the step keeps the layer, whereas a norm would let many
    noise elements outweigh it. One step, not half: saving a weight in `dtype` moves it by at most half a step; the
    other half is room for an earlier, finer rounding (a float32 model saved in float16, extracted in bfloat16). A
    change within one step moves a weight held in `dtype` by at most one representable value."""
    info = torch.finfo(dtype)
    _, exponent = torch.frexp(base.abs().clamp_min(info.smallest_normal))  # |w| = m·2^e, m in [0.5, 1)
    step = info.eps * torch.exp2(exponent.float() - 1)  # eps·2^(e-1): the spacing in w's binade
    return bool(((tuned - base).abs() <= step).all())


def extract(ex: Extraction, progress: Callable[[str, int, int], None] | None = None) -> Extracted:
    """Write the LoRA; its path, each layer's report and what was left out.
    `progress(what, done, total)` is told each phase and layer, and may raise to stop before anything is written."""
    from onetrainer.families.base import PartRole
    from onetrainer.precision.dtypes import torch_dtype
    from onetrainer.tools.lora_files import _energy_rank, _factors
    from onetrainer.util.fs import atomic_file
    from onetrainer.weights.lycoris_keys import to_kohya
    from onetrainer.weights.metadata import lora_metadata

    problems = ex.problems()
    if problems:
        raise ExtractError("; ".join(problems))
    progress = progress or (lambda what, done, total: None)
    progress("loading the models", 0, 0)
    family, base = _load(ex.model_type, ex.base_model_name, ex.transformer_model_name)
    if ex.tuned_is_transformer:
        _, tuned = _load(ex.model_type, ex.base_model_name, ex.tuned_model_name)
    else:
        _, tuned = _load(ex.model_type, ex.tuned_model_name)
    adapted = [p for p, r in family.part_roles.items() if r in (PartRole.DENOISER, PartRole.TEXT_ENCODER)]
    total = sum(len(list(base.part(p).modules())) for p in adapted if p in base.parts)
    done = 0
    out: dict[str, torch.Tensor] = {}
    reports: list[LayerReport] = []
    left_out, rounding = 0, {}
    dtype = torch_dtype(ex.output_dtype)
    for part in adapted:
        if part not in base.parts:
            continue
        layers, ranks, changed_other = {}, {}, 0
        tuned_modules = dict(tuned.part(part).named_modules())
        for name, layer in base.part(part).named_modules():
            progress("extracting", done, total)
            done += 1
            other = tuned_modules.get(name)
            if other is None:
                continue
            if isinstance(layer, torch.nn.Linear | torch.nn.Conv2d):
                if layer.bias is not None and not within_rounding(layer.bias.detach(), other.bias.detach(), dtype):
                    changed_other += 1
                weight, theirs = layer.weight.detach().float(), other.weight.detach().float()
                if torch.equal(weight, theirs):
                    continue
                if within_rounding(weight, theirs, dtype):
                    rounding[part] = rounding.get(part, 0) + 1
                    continue
                delta = (theirs - weight).flatten(1)
                limit = min(delta.shape)
                rank = min(limit, ex.rank) if ex.rank is not None else _energy_rank(delta, ex.energy, limit)
                down, up, kept = _factors(delta, rank, _Shape(layer))
                layers[name] = (down, up)
                ranks[name] = down.shape[0]
                reports.append(LayerReport(part, name, down.shape[0], kept))
            elif not list(layer.children()):  # norms, embeddings: a LoRA cannot hold their change
                for pname, param in layer.named_parameters(recurse=False):
                    theirs = getattr(other, pname, None)
                    if theirs is not None and not within_rounding(param.detach(), theirs.detach(), dtype):
                        changed_other += 1
        left_out += changed_other
        if not layers:
            continue
        state = {}
        for name, (down, up) in layers.items():
            state[f"{name}.lora_A.weight"] = down
            state[f"{name}.lora_B.weight"] = up
        alphas = {name: float(r) for name, r in ranks.items()}
        if ex.output_format is ModelFormat.DIFFUSERS_LORA:
            out.update(diffusers_lora.file_state(part, base.part(part), state, ranks, alphas))
        else:
            own = family.lora_file_state(base, part, "lora", state, alphas, ranks, ex.output_format)
            name_of = lambda m, p=part: family.lora_file_name(base, p, m, ex.output_format)  # noqa: E731
            out.update(own if own is not None else to_kohya("lora", state, name_of, alphas, ranks))
    if not reports:
        noise = sum(rounding.values())
        beyond = f" by more than {ex.output_dtype.value}'s rounding ({noise} differ by less)" if noise else ""
        raise ExtractError(
            f"{ex.tuned_model_name} has no layer a LoRA can hold that differs from {ex.base_model_name}{beyond}"
        )
    out = {k: (v if k.endswith(".alpha") else v.to(dtype)).contiguous() for k, v in out.items()}
    resolution = base.type_info.resolution
    top = max(r.rank for r in reports)
    destination = ex.destination.expanduser()
    prediction = base.schedule.prediction
    metadata = lora_metadata(family.metadata_kind(base), destination.stem, (resolution, resolution), prediction,
                             top, float(top))  # fmt: skip
    metadata[LORA_TOOL_KEY] = json.dumps({"command": "extract", "rank": ex.rank, "energy": ex.energy})
    from safetensors.torch import save_file

    try:
        with atomic_file(destination) as tmp:
            save_file(out, str(tmp), metadata=metadata)
    except OSError as e:
        raise ExtractError(f"cannot write {destination}: {e.strerror or e}") from e
    return Extracted(destination, reports, left_out, rounding)


@dataclass
class _Shape:
    """What `_factors` reads of a module: its down factor's shape (rank first)."""

    down: torch.Tensor

    def __init__(self, layer: torch.nn.Module) -> None:
        weight = layer.weight
        self.down = torch.empty(0, *weight.shape[1:]) if weight.dim() == 4 else torch.empty(0, weight.shape[1])


def _load(model_type: ModelType, name: str, transformer: str = ""):
    from onetrainer.config import TrainConfig
    from onetrainer.tools.convert import load_float32

    config = TrainConfig()
    config.model_type = model_type
    config.training_method = TrainingMethod.FINE_TUNE
    config.base_model_name = name
    config.transformer.model_name = transformer
    return load_float32(config, ExtractError)
