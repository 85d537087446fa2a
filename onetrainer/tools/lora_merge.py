"""`scripts/lora_tool.py merge`: a LoRA file of any kind this trainer reads (LoRA, LoHa, LoKr, DoRA, OFT, in kohya's
or diffusers' names) merged into its base model at a strength and written as a fine-tune in a format the family saves.

The file is read the way a run continues from it (`lora_model_name`: the family's names, every adapter kind), then
each adapted layer's weight becomes the weight its forward pass computes: peft's own merge for LoRA, LoHa, LoKr and
OFT (the strength scales peft's `scaling`), the decomposed formula for DoRA and decomposed LoKr (m·(W + s·ΔW)/‖W +
s·ΔW‖). The wrappers are then taken off, so the saved model is the base model's layout with new weights.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from onetrainer.config import ModelFormat, ModelType, TrainingMethod
from onetrainer.config.enums import DataType
from onetrainer.weights.metadata import LORA_TOOL_KEY


class MergeError(Exception):
    """The merge cannot be done; the message names the file or the setting."""


@dataclass(frozen=True)
class Merge:
    model_type: ModelType
    base_model_name: str
    lora: str
    output_format: ModelFormat
    destination: Path
    output_dtype: DataType = DataType.FLOAT_16
    strength: float = 1.0
    overwrite: bool = False
    transformer_model_name: str = ""  # the base model's transformer from a file of its own (`transformer.model_name`)

    def problems(self) -> list[str]:
        from onetrainer.config.model_types import model_type_info

        out = []
        formats = model_type_info(self.model_type).family.output_formats.get(TrainingMethod.FINE_TUNE, ())
        if self.output_format not in formats:
            allowed = ", ".join(f.value for f in formats)
            out.append(f"--output-model-format {self.output_format.value}: a merged model is saved as {allowed}")
        if not Path(self.lora).expanduser().is_file():
            out.append(f"--lora {self.lora}: no such file")
        destination = self.destination.expanduser()
        if destination.exists() and not self.overwrite:
            out.append(f"{destination} exists; add --overwrite to replace it")
        return out


def merge_into_base(merge: Merge, progress: Callable[[str, int, int], None] | None = None) -> list[Path]:
    """Load the base with the LoRA, merge it at the strength, save; the paths written. Raises MergeError.
    `progress(what, done, total)` is told each phase and layer, and may raise to stop before anything is written."""
    from onetrainer.config import TrainConfig
    from onetrainer.methods import create_method
    from onetrainer.methods.adapters import adapter_layers
    from onetrainer.precision.dtypes import torch_dtype
    from onetrainer.tools.convert import load_float32

    problems = merge.problems()
    if problems:
        raise MergeError("; ".join(problems))
    config = TrainConfig()
    config.model_type = merge.model_type
    config.training_method = TrainingMethod.LORA
    config.base_model_name = merge.base_model_name
    config.transformer.model_name = merge.transformer_model_name
    config.lora_model_name = str(Path(merge.lora).expanduser())
    config.lora_weight_dtype = DataType.FLOAT_32
    try:
        for key, value in file_settings(Path(merge.lora).expanduser()).items():
            setattr(config, key, value)
    except (OSError, ValueError) as e:
        raise MergeError(f"cannot read the LoRA {merge.lora}: {e}") from e
    progress = progress or (lambda what, done, total: None)
    progress("loading the model and the LoRA", 0, 0)
    family, model = load_float32(config, MergeError)
    try:
        create_method(config, family, model, torch.device("cpu"))
    except Exception as e:
        raise MergeError(f"cannot read the LoRA {merge.lora}: {e}") from e
    layers = {part: list(adapter_layers(model.part(part))) for part in list(model.parts)}
    total, merged = sum(len(v) for v in layers.values()), 0
    for part, adapted in layers.items():
        for layer in adapted:
            progress("merging", merged, total)
            _merge_layer(layer, merge.strength)
            merged += 1
        _unwrap(model.part(part))
    if not merged:
        raise MergeError(f"{merge.lora} adapts no layer of {merge.base_model_name}")
    destination = merge.destination.expanduser()
    progress(f"writing {destination.name}", 0, 0)
    try:
        made = {"command": "merge", "lora": Path(merge.lora).name, "strength": merge.strength}
        metadata = {LORA_TOOL_KEY: json.dumps(made)}  # in a single file's header (a diffusers folder has none)
        family.save(model, merge.output_format, destination, torch_dtype(merge.output_dtype), metadata)
    except OSError as e:
        raise MergeError(f"cannot write {destination}: {e.strerror or e}") from e
    return [destination]


def file_settings(path: Path) -> dict:
    """The LoRA tab's settings a file was trained with, as far as reading it back needs them: the adapter kind and its
    decomposition options, from the file's tensors (kohya / LyCORIS names; diffusers' names hold plain LoRA)."""
    import math

    from onetrainer.config.enums import PeftType
    from onetrainer.weights.adapter_kinds import DORA, LOHA, LOKR, OFT
    from onetrainer.weights.checkpoint_files import load_state_dict
    from onetrainer.weights.lycoris_keys import detect_kind

    state = {k: v for k, v in load_state_dict(path).items() if not k.startswith("bundle_emb.")}
    kind = detect_kind(state) if any(k.startswith("lora_") for k in state) else None
    scales = [v for k, v in state.items() if k.endswith(".dora_scale")]
    # A DoRA scale per output row is (out, 1); per input column (1, in).
    on_output = bool(scales) and scales[0].dim() >= 2 and scales[0].shape[0] > 1 and scales[0].shape[1] == 1
    if kind == LOHA:
        return {"peft_type": PeftType.LOHA}
    if kind == LOKR:
        settings = {"peft_type": PeftType.LOKR, "lokr_weight_decompose": bool(scales)}
        return settings | ({"lokr_dora_on_output": on_output} if scales else {})
    if kind == OFT:
        vectors = next(v for k, v in state.items() if k.endswith(".oft_R.weight"))
        size = round((1 + math.sqrt(1 + 8 * vectors.shape[-1])) / 2)
        scaled = any(k.endswith(".scaled_oft") for k in state)
        return {"peft_type": PeftType.OFT_2, "oft_block_size": size, "oft_scaled": scaled}
    if kind == DORA:
        return {"peft_type": PeftType.LORA, "lora_decompose": True, "lora_decompose_output_axis": on_output}
    return {"peft_type": PeftType.LORA, "lora_decompose": False}


@torch.no_grad()
def _merge_layer(layer: torch.nn.Module, strength: float) -> None:
    from onetrainer.methods.adapters import DoraLayer, _axis_norm, _is_decomposed

    if isinstance(layer, DoraLayer):
        layer.alpha = layer.alpha * strength
        layer.base_layer.weight.copy_(layer.merged_weight().to(layer.base_layer.weight.dtype))
        return
    base = layer.get_base_layer()
    adapters = list(layer.active_adapters)
    if _is_decomposed(layer):
        delta = sum(layer.get_delta_weight(a) for a in adapters) * strength
        adapted = base.weight.float() + delta
        base.weight.copy_(
            (layer.dora_scale * adapted / _axis_norm(adapted, layer.dora_on_output)).to(base.weight.dtype)
        )
        return
    if strength != 1.0:
        scaling = getattr(layer, "scaling", None)
        if not isinstance(scaling, dict):
            raise MergeError(f"a {type(layer).__name__} layer has no strength to scale: merge it at strength 1")
        for adapter in adapters:
            scaling[adapter] = scaling[adapter] * strength
    layer.merge(adapter_names=adapters)


def _unwrap(module: torch.nn.Module) -> None:
    """Every adapter wrapper replaced by the layer it wraps (its weight now merged)."""
    from onetrainer.methods.adapters import DoraLayer

    for name, layer in list(module.named_modules()):
        base = layer.base_layer if isinstance(layer, DoraLayer) else None
        if base is None and hasattr(layer, "get_base_layer") and layer is not layer.get_base_layer():
            base = layer.get_base_layer()
        if base is None or not name:
            continue
        parent_name, _, child = name.rpartition(".")
        parent = module.get_submodule(parent_name) if parent_name else module
        if getattr(parent, child, None) is layer:
            setattr(parent, child, base)
