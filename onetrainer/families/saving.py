"""Writing a family's fine-tune outputs, shared by the families: the weights without adapter wrappers, one
safetensors file cast to the output dtype, a diffusers pipeline folder, and `save`'s choice of writer by format.

The cast happens in the written data, never in the live modules: casting a training model down and back would round
its weights.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from onetrainer.config.enums import ModelFormat
from onetrainer.util.fs import atomic_directory, atomic_file

if TYPE_CHECKING:
    from onetrainer.families.base import Family, LoadedModel, Writer


def plain_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A module's weights without adapter wrappers (LoRA layers must be merged or removed before saving)."""
    return {k: v for k, v in module.state_dict().items() if "lora_" not in k}


def cast_state(state: Mapping[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The state on the CPU, contiguous, its floating tensors in `dtype`; integer tensors keep their dtype."""
    return {k: v.detach().to("cpu", dtype if v.is_floating_point() else v.dtype).contiguous() for k, v in state.items()}


def write_single_file(
    state: Mapping[str, torch.Tensor], destination: Path, dtype: torch.dtype, metadata: dict[str, str]
) -> None:
    """One safetensors file written atomically: `state` cast to `dtype` (`cast_state`), `metadata` as its header."""
    from safetensors.torch import save_file

    with atomic_file(destination) as tmp:
        save_file(cast_state(state, dtype), str(tmp), metadata=metadata)


def model_file_metadata(
    family: Family, model: LoadedModel, destination: Path, extra: dict | None = None, resolution: int | None = None
) -> dict[str, str]:
    """A fine-tune file's header: the modelspec metadata of the family's model kind, titled after the file, at
    `resolution` (default: the model type's), saying what the model predicts (its schedule's), then `extra`."""
    from onetrainer.weights.metadata import model_metadata

    side = resolution or model.type_info.resolution
    title = Path(destination).stem
    metadata = model_metadata(family.metadata_kind(model), title, (side, side), model.schedule.prediction)
    metadata.update(extra or {})
    return metadata


def save_pipeline_folder(pipe, destination: Path, dtype: torch.dtype) -> None:
    """A diffusers pipeline written atomically as a folder, its weights in `dtype`, cast in the written files."""
    from safetensors.torch import load_file, save_file

    from onetrainer.util.quiet import no_progress_bars

    with atomic_directory(destination) as tmp, no_progress_bars():
        pipe.save_pretrained(str(tmp), safe_serialization=True)
        if dtype != torch.float32:
            for file in tmp.rglob("*.safetensors"):
                tensors = {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in load_file(str(file)).items()}
                save_file(tensors, str(file), metadata={"format": "pt"})


def save_in_format(
    family: Family,
    writers: Mapping[ModelFormat, Writer],
    model: LoadedModel,
    fmt: ModelFormat,
    destination: Path,
    dtype: torch.dtype,
    metadata: dict | None = None,
) -> None:
    """`Family.save` through the family's table of writers: `writers` maps each output format to the family's method
    that writes it, called as `writer(family, model, destination, dtype, metadata)`. Any other format is refused here,
    in one message for every family."""
    writer = writers.get(fmt)
    if writer is None:
        formats = ", ".join(f.value for f in writers)
        raise ValueError(f"{fmt.value} is not a model format of {family.info.label} (it saves as {formats})")
    writer(family, model, destination, dtype, metadata)


class FlowPipelineFolder:
    """Fine-tune outputs and backups as the family's diffusers pipeline folder with its flow-matching Euler sampler on
    the model's own scheduler config, for the families on `noise/flow_matching` that sample through one pipeline
    (Flux and Chroma, SD 3): put before `Family` in the bases. The backup is such a folder too, so it can also be a
    base model; its parts are read back named as the modules name their weights."""

    def save_diffusers(
        self, model: LoadedModel, destination: Path, dtype: torch.dtype, metadata: dict | None = None
    ) -> None:
        """The diffusers pipeline folder, with the model's own sampler (`metadata`, a single file's header entries,
        has no place in it)."""
        from diffusers import FlowMatchEulerDiscreteScheduler

        scheduler = FlowMatchEulerDiscreteScheduler.from_config(model.schedule.scheduler_config)
        save_pipeline_folder(self.pipeline(model, scheduler), destination, dtype)

    def save_backup(self, model: LoadedModel, folder: Path) -> None:
        self.save_diffusers(model, folder, torch.float32)

    def backup_state(self, model: LoadedModel, folder: Path, part: str) -> dict[str, torch.Tensor]:
        from onetrainer.families.loading import as_module_state

        return as_module_state(model.part(part), super().backup_state(model, folder, part))
