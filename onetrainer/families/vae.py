"""The KL VAE (`AutoencoderKL`) as the families that encode images with it share it: the encoding into the latents
the denoiser takes, and the VAE override of the config (`vae.model_name`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from onetrainer.families.loading import (
    ModelLoadError,
    assign_weights,
    empty_module,
    hub_options,
    load_diffusers_component,
    load_dtype,
    read_pretrained,
)
from onetrainer.families.sources import ModelNotFound, resolve_local, resolve_source
from onetrainer.util.part_dtypes import compute_weight
from onetrainer.weights.checkpoint_files import load_state_dict

if TYPE_CHECKING:
    from onetrainer.config import TrainConfig

VAE_PREFIX = "first_stage_model."  # the VAE's keys in an original (LDM / SGM) single file


def encode_latents(vae: torch.nn.Module, pixels: torch.Tensor) -> torch.Tensor:
    """Pixels [B, 3, H, W] in [-1, 1] → the mode of the VAE's latent distribution, shifted and scaled as its config
    says (`shift_factor`, which SD-type VAEs leave unset, then `scaling_factor`): what the denoiser takes."""
    weight = compute_weight(vae)
    latents = vae.encode(pixels.to(weight.device, weight.dtype)).latent_dist.mode()
    shift = getattr(vae.config, "shift_factor", None)
    if shift is not None:
        latents = latents - shift
    return latents * vae.config.scaling_factor


def convert_vae(state: dict, vae) -> dict:
    """An original (LDM) VAE state dict, its prefix removed, in the diffusers names of `vae`."""
    from diffusers.loaders.single_file_utils import convert_ldm_vae_checkpoint

    return convert_ldm_vae_checkpoint(state, vae.config)


def load_vae(config: TrainConfig, where: str, options: dict) -> torch.nn.Module:
    """The base's VAE (the `vae` subfolder of `where`), or the config's override (`vae.model_name`) read on its
    config."""
    from diffusers import AutoencoderKL

    if config.vae.model_name:
        base_config = load_diffusers_component(AutoencoderKL, where, "vae", options, config_only=True)
        return load_vae_override(config, base_config)
    return load_diffusers_component(AutoencoderKL, where, "vae", options, dtype=load_dtype(config, "vae"))


def load_vae_override(config: TrainConfig, base_config, cls=None) -> torch.nn.Module:
    """The VAE named in the config: a diffusers folder (a VAE's, or a pipeline's with a vae/ subfolder), a single file
    (a VAE's, or a whole original checkpoint's, read on the base VAE's config `base_config`; a VAE class other than
    AutoencoderKL, `cls`, reads it in diffusers' names), or a hub id (a VAE repo or a pipeline repo), loaded like the
    base model (from the cache when offline)."""
    from diffusers import AutoencoderKL

    kl = cls is None or cls is AutoencoderKL
    cls = AutoencoderKL if cls is None else cls
    dtype = load_dtype(config, "vae")
    name = config.vae.model_name.strip()
    path = resolve_local(name)
    if path.is_dir():
        subfolder = "vae" if (path / "vae" / "config.json").is_file() else None
        return read_pretrained(cls, str(path), dtype, subfolder=subfolder, local_files_only=True)
    if path.is_file():
        # a whole original checkpoint's other parts are not the VAE's: read as stored, and let go at once
        state = load_state_dict(path, lambda key: dtype if key.startswith(VAE_PREFIX) else None)
        vae = empty_module(lambda: cls.from_config(dict(base_config)))
        prefix = VAE_PREFIX if any(k.startswith(VAE_PREFIX) for k in state) else ""
        if not prefix:
            state = {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in state.items()}
        state = {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
        # built in float32 and the file's tensors copied in, before: the weights as that copy and the cast left them
        return assign_weights(vae, convert_vae(state, vae) if kl else state, dtype, f"VAE {path}", torch.float32)
    try:
        source = resolve_source(name)
    except ModelNotFound as e:
        raise ModelLoadError(f"VAE override (vae.model_name) not found: {e}") from e
    options = hub_options(source, config, "the VAE override")
    try:  # a VAE repo keeps its config at the top; a pipeline repo in vae/
        return read_pretrained(cls, name, dtype, **options)
    except (OSError, ValueError):
        return load_diffusers_component(cls, name, "vae", options, dtype=dtype)
