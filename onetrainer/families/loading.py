"""Loading helpers shared by the families: diffusers components with clear errors, dtypes, strict state dicts."""

from __future__ import annotations

import logging

import torch

from onetrainer.util.dtypes import torch_dtype

log = logging.getLogger(__name__)


class ModelLoadError(Exception):
    """A model that cannot be loaded, with a message that says why and what to do."""


def hub_options(source, config) -> dict:
    """from_pretrained options for a model source: local folders never reach the hub, hub ids only when online."""
    hub = source.kind == "hub"
    options = {"local_files_only": config.offline_mode or not hub}
    if hub and config.huggingface_cache_dir:
        options["cache_dir"] = config.huggingface_cache_dir
    return options


def load_diffusers_component(cls, where: str, subfolder: str, options: dict, config_only: bool = False):
    try:
        if config_only:
            return cls.load_config(where, subfolder=subfolder, **options)
        return cls.from_pretrained(where, subfolder=subfolder, **options)
    except (OSError, ValueError) as e:
        raise ModelLoadError(_explain(where, subfolder, options, e)) from e


def load_tokenizer(where: str, options: dict, subfolder: str = "tokenizer"):
    from transformers import CLIPTokenizer

    try:
        return CLIPTokenizer.from_pretrained(where, subfolder=subfolder, **options)
    except (OSError, ValueError) as e:
        raise ModelLoadError(_explain(where, subfolder, options, e)) from e


def _explain(where: str, subfolder: str, options: dict, error: Exception) -> str:
    from pathlib import Path

    if Path(where).exists():
        return f"cannot load the {subfolder} of {where}: {error}"
    if options.get("local_files_only"):
        return (
            f"'{where}' is not in the local Hugging Face cache and cannot be downloaded (offline mode is on, or "
            f"the hub is unreachable): {type(error).__name__}"
        )
    return (
        f"could not download '{where}' from the Hugging Face hub ({type(error).__name__}: {error}). Without a "
        "connection, use a local folder or .safetensors file"
    )


def cast_parts(parts: dict[str, torch.nn.Module], config) -> None:
    """Put each part in its configured weight dtype."""
    from onetrainer.util.quantize import quantize_part

    for name, module in parts.items():
        if quantize_part(name, module, config):  # FLOAT_8 / NFLOAT_4: stored quantized, computed in the train dtype
            continue
        dtype = torch_dtype(config.part(name).weight_dtype)
        if next(module.parameters()).dtype != dtype:
            module.to(dtype=dtype)


def checked_load(module: torch.nn.Module, state: dict, what: str) -> None:
    """Load a converted state dict; a missing or unexpected weight is an error naming the part."""
    result = module.load_state_dict(state, strict=False)
    missing = [k for k in result.missing_keys if not k.endswith("position_ids")]
    if missing or result.unexpected_keys:
        details = []
        if missing:
            details.append(f"{len(missing)} weights missing (e.g. {missing[0]})")
        if result.unexpected_keys:
            details.append(f"{len(result.unexpected_keys)} unexpected (e.g. {result.unexpected_keys[0]})")
        raise ModelLoadError(f"{what} does not match the model layout: {', '.join(details)}")


def training_scheduler(scheduler_config: dict, v_prediction: bool, zero_terminal_snr: bool):
    """A DDPM scheduler with the model's noise schedule, used for adding noise and computing targets."""
    from diffusers import DDPMScheduler

    overrides = {"prediction_type": "v_prediction" if v_prediction else "epsilon"}
    if zero_terminal_snr:
        overrides["rescale_betas_zero_snr"] = True
    return DDPMScheduler.from_config(dict(scheduler_config), **overrides)
