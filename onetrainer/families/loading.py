"""Loading helpers shared by the families: diffusers components with clear errors, dtypes, strict state dicts, a
fine-tune backup as a base model, the inpainting check of a model type."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from onetrainer.config.model_types import model_type_info
from onetrainer.families.sources import ModelSource
from onetrainer.util.dtypes import torch_dtype

if TYPE_CHECKING:
    from onetrainer.config import TrainConfig
    from onetrainer.config.enums import ModelType
    from onetrainer.util.hub import FileSets

log = logging.getLogger(__name__)


class ModelLoadError(Exception):
    """A model that cannot be loaded, with a message that says why and what to do."""


def hub_options(source, config: TrainConfig, what: str = "the base model", file_sets: FileSets = ()) -> dict:
    """from_pretrained options for a model source: local folders never reach the hub; a hub id is loaded from the cache
    alone when offline or when the hub cannot be reached, and refused at once when it is in neither (`util/hub.py`)."""
    if source.kind != "hub":
        return {"local_files_only": True}
    from onetrainer.util.hub import hub_access

    cache_dir = config.huggingface_cache_dir or None
    access = hub_access(source.location, cache_dir, config.offline_mode, what, file_sets)
    if access.problem:
        raise ModelLoadError(access.problem)
    options = {"local_files_only": access.local_files_only}
    if cache_dir:
        options["cache_dir"] = cache_dir
    return options


def load_diffusers_component(cls, where: str, subfolder: str, options: dict, config_only: bool = False):
    try:
        if config_only:
            return cls.load_config(where, subfolder=subfolder, **options)
        return cls.from_pretrained(where, subfolder=subfolder, **options)
    except (OSError, ValueError) as e:
        raise ModelLoadError(_explain(where, subfolder, options, e)) from e


def load_tokenizer(where: str, options: dict, subfolder: str = "tokenizer", cls=None):
    """A tokenizer of a diffusers folder or hub id: `cls` (a transformers tokenizer class, CLIPTokenizer by default)."""
    if cls is None:
        from transformers import CLIPTokenizer as cls

    try:
        return cls.from_pretrained(where, subfolder=subfolder, **options)
    except (OSError, ValueError) as e:
        raise ModelLoadError(_explain(where, subfolder, options, e)) from e


def _explain(where: str, subfolder: str, options: dict, error: Exception) -> str:
    from pathlib import Path

    from onetrainer.util.hub import unavailable_message

    if Path(where).exists():
        return f"cannot load the {subfolder} of {where}: {error}"
    if options.get("local_files_only"):
        # hub_options found the model in the cache, but not this part of it
        reason = f"its {subfolder} is missing there, and the hub cannot be used now (offline, or unreachable)"
        return unavailable_message(where, options.get("cache_dir"), reason, "the base model")
    return (
        f"could not download the {subfolder} of '{where}' from the Hugging Face hub ({type(error).__name__}: {error}). "
        "Without a connection, use a local folder or .safetensors file"
    )


def cast_parts(parts: dict[str, torch.nn.Module], config: TrainConfig) -> None:
    """Put each part in its configured weight dtype (the quantization filter applies to the denoiser)."""
    from onetrainer.config.model_types import model_type_info
    from onetrainer.util.quantize import quantize_part

    denoiser = model_type_info(config.model_type).family.parts[0]
    for name, module in parts.items():
        # the quantized kinds: stored in 8 or 4 bits, computed in the train dtype
        if quantize_part(name, module, config, filtered=name == denoiser):
            continue
        dtype = torch_dtype(config.part(name).weight_dtype)
        if next(module.parameters()).dtype != dtype:
            module.to(dtype=dtype)


def checked_load(module: torch.nn.Module, state: dict, what: str, assign: bool = False) -> None:
    """Load a converted state dict; a missing or unexpected weight is an error naming the part. `assign`: the module's
    parameters become the state's tensors (a module built without weights, on the meta device)."""
    result = module.load_state_dict(state, strict=False, assign=assign)
    missing = [k for k in result.missing_keys if not k.endswith("position_ids")]
    if missing or result.unexpected_keys:
        details = []
        if missing:
            details.append(f"{len(missing)} weights missing (e.g. {missing[0]})")
        if result.unexpected_keys:
            details.append(f"{len(result.unexpected_keys)} unexpected (e.g. {result.unexpected_keys[0]})")
        raise ModelLoadError(f"{what} does not match the model layout: {', '.join(details)}")


def backup_model_source(backup: Path) -> ModelSource:
    """The whole model in a fine-tune backup (`<backup>/model`, a diffusers folder) as the source to load; a backup
    of a LoRA or embedding run holds no whole model, and is refused with what to do instead."""
    folder = backup / "model"
    if (folder / "model_index.json").is_file():
        return ModelSource("diffusers", str(folder))
    raise ModelLoadError(
        f"{backup} is a backup of a LoRA or embedding run, not a whole model: resume it with 'Continue from last "
        "backup', or use its LoRA / embedding file"
    )


def part_wise_base(config: TrainConfig, label: str, parts: str, file_sets: FileSets = ()) -> tuple[str, dict]:
    """Where a part-wise (diffusers) base model is and its hub options, for a family whose single-file checkpoints
    hold the transformer alone: such a file as the base model is refused with where it goes instead
    (`transformer.model_name`), and a fine-tune backup is its whole model. `parts`: what the base brings besides."""
    from onetrainer.families.sources import resolve_source

    source = resolve_source(config.base_model_name)
    if source.kind == "single_file":
        raise ModelLoadError(
            f"{source.location} is a single file: a {label} checkpoint holds the transformer alone. Set the base "
            f"model to a diffusers {label} folder or hub id (for {parts}) and the transformer's model "
            "(transformer.model_name) to this file"
        )
    if source.kind == "backup":
        source = backup_model_source(source.path)
    return source.location, hub_options(source, config, file_sets=file_sets)


def check_inpainting(inpainting: bool, model_type: ModelType, source: object, what: str = "model") -> None:
    """Refuse an inpainting model (`inpainting`: what its weights say, e.g. 9 UNet input channels) for a plain model
    type, and the reverse: `source` is {"an inpainting" / "not an inpainting"} `what`."""
    if inpainting != model_type_info(model_type).inpainting:
        which = "an inpainting" if inpainting else "not an inpainting"
        raise ModelLoadError(f"{source} is {which} {what}, which does not fit the model type {model_type.value}")


def as_module_state(module: torch.nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A part's weights as a pipeline folder holds them, named as `module`'s own state dict: transformers writes T5's
    tied token table once (`shared.weight`), which the module also names in its encoder, and CLIPTextModel's weights
    with a `text_model.` level its state dict may not have."""
    own = set(module.state_dict())
    if "shared.weight" in state and "encoder.embed_tokens.weight" in own:
        state.setdefault("encoder.embed_tokens.weight", state["shared.weight"])
    return {(k if k in own else k.removeprefix("text_model.")): v for k, v in state.items()}


def load_transformer_part(
    cls, config: TrainConfig, where: str, options: dict, to_diffusers: Callable[[dict], dict]
) -> torch.nn.Module:
    """The base's transformer (`cls`, diffusers), or the transformer part's own model (`transformer.model_name`): a
    diffusers folder, or one file whose weights `to_diffusers` names as diffusers does, built on the base's
    transformer config without weights (the file's tensors become them: no second copy in memory)."""
    from accelerate import init_empty_weights

    from onetrainer.families.sources import resolve_local
    from onetrainer.weights.checkpoint_files import load_state_dict

    override = config.transformer.model_name.strip()
    if not override:
        return load_diffusers_component(cls, where, "transformer", options)
    path = resolve_local(override)
    if path.is_dir():
        subfolder = "transformer" if (path / "transformer" / "config.json").is_file() else None
        return cls.from_pretrained(str(path), subfolder=subfolder, local_files_only=True)
    if not path.is_file():
        raise ModelLoadError(f"the transformer's model (transformer.model_name) was not found: {override}")
    base_config = load_diffusers_component(cls, where, "transformer", options, config_only=True)
    try:
        state = to_diffusers(load_state_dict(path))
    except ValueError as e:
        raise ModelLoadError(f"cannot read the transformer (transformer.model_name) {path}: {e}") from e
    with init_empty_weights(include_buffers=False):
        transformer = cls.from_config(base_config)
    checked_load(transformer, state, f"the transformer {path}", assign=True)
    return transformer
