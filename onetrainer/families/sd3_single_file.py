"""Stable Diffusion 3 / 3.5 from one original file (Stability AI's layout, `sd3_medium_incl_clips_t5xxlfp8.safetensors`,
`sd3.5_large.safetensors`, or ours written as ORIGINAL_SINGLE_FILE) as the base model.

Such a file holds the transformer under `model.diffusion_model.`, usually the VAE under `first_stage_model.`, and
sometimes the text encoders under `text_encoders.clip_l/clip_g/t5xxl.transformer.`; it holds no configs and no
tokenizers. As diffusers' `from_single_file` does, those come from the variant's diffusers repository (its
"companion": SD 3 Medium's, 3.5 Medium's or 3.5 Large's, told apart by the file's weights), as do the parts the file
lacks; the companion is loaded like a base model named by its hub id (from the hub cache when offline). The file's
weights are assigned to modules built on the companion's configs (no second copy in memory), and a weight that does
not fit is an error naming the part and the file.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from onetrainer.families.loading import (
    ModelLoadError,
    as_module_state,
    assign_weights,
    empty_module,
    file_reading,
    hub_options,
    load_dtype,
    read_dtypes,
)
from onetrainer.families.vae import VAE_PREFIX, convert_vae
from onetrainer.weights.checkpoint_files import load_state_dict
from onetrainer.weights.sd3_keys import TEXT_ENCODER_PREFIXES, TRANSFORMER_PREFIX

if TYPE_CHECKING:
    from onetrainer.config import TrainConfig

# diffusers' own choice of config repository for each variant of an SD 3 file (`single_file_utils`).
# The parts whose tensors a module built without weights takes as they are, by their prefix in the file.
PART_PREFIXES = {TRANSFORMER_PREFIX: "transformer", **{prefix: part for part, prefix in TEXT_ENCODER_PREFIXES.items()}}
COMPANIONS = {
    "sd3": "stabilityai/stable-diffusion-3-medium-diffusers",
    "sd35_medium": "stabilityai/stable-diffusion-3.5-medium",
    "sd35_large": "stabilityai/stable-diffusion-3.5-large",
}


@dataclass
class SingleFileParts:
    """The parts read from the file, and where the rest (tokenizers, scheduler, missing parts) comes from."""

    parts: dict[str, torch.nn.Module] = field(default_factory=dict)
    companion: str = ""
    options: dict = field(default_factory=dict)


def variant_of(transformer_keys: set[str]) -> str:
    """SD 3.5 normalises queries and keys (`attn.ln_q`); 3.5 Medium adds a second image attention (`attn2`)."""
    if not any(".attn.ln_q." in key for key in transformer_keys):
        return "sd3"
    return "sd35_medium" if any(".attn2." in key for key in transformer_keys) else "sd35_large"


def read_single_file(path: Path, config: TrainConfig) -> SingleFileParts:
    """The transformer, and the VAE and text encoders the file holds, built on the companion's configs; T5 only where
    the config includes it."""
    from diffusers import AutoencoderKL, SD3Transformer2DModel
    from diffusers.loaders.single_file_utils import convert_sd3_transformer_checkpoint_to_diffusers

    from onetrainer.families.sources import resolve_source

    # Each part read in its dtype (the VAE used to be built in float32 and the file's tensors copied in; the others
    # took the file's tensors as they were, `file_reading`), each part's tensors taken out of `state` as it gets them.
    readings = {part: file_reading(path, load_dtype(config, part), prefix) for prefix, part in PART_PREFIXES.items()}
    owners = {prefix: part for prefix, part in PART_PREFIXES.items() if readings[part][0] is not None}
    state = load_state_dict(path, read_dtypes(config, {**owners, VAE_PREFIX: "vae"}))
    transformer_state = _take(state, TRANSFORMER_PREFIX)
    if not transformer_state:
        raise ModelLoadError(
            f"{path} holds no Stable Diffusion 3 transformer (no weights under {TRANSFORMER_PREFIX}): choose a "
            "Stable Diffusion 3 checkpoint or a diffusers folder"
        )
    companion = COMPANIONS[variant_of(set(transformer_state))]
    options = hub_options(resolve_source(companion), config, f"the configs and tokenizers for {path.name}")
    result = SingleFileParts(companion=companion, options=options)

    transformer_config = _config(SD3Transformer2DModel, companion, "transformer", options)
    try:
        converted = convert_sd3_transformer_checkpoint_to_diffusers(transformer_state)
    except (KeyError, IndexError) as e:
        raise ModelLoadError(f"the transformer of {path} is not in Stability AI's layout: missing {e}") from e
    del transformer_state  # the converted names hold its tensors
    transformer = empty_module(lambda: SD3Transformer2DModel.from_config(transformer_config))
    what = f"the transformer of {path}"
    dtype = load_dtype(config, "transformer")
    result.parts["transformer"] = assign_weights(transformer, converted, dtype, what, readings["transformer"][1])

    vae_state = _take(state, VAE_PREFIX)
    if vae_state:
        vae = empty_module(lambda: AutoencoderKL.from_config(_config(AutoencoderKL, companion, "vae", options)))
        dtype, what = load_dtype(config, "vae"), f"the VAE of {path}"
        result.parts["vae"] = assign_weights(vae, convert_vae(vae_state, vae), dtype, what, torch.float32)

    for part, prefix in TEXT_ENCODER_PREFIXES.items():
        if part == "text_encoder_3" and not config.text_encoder_3.include:
            continue
        encoder_state = _take(state, prefix)
        if encoder_state:
            what = f"the {part} of {path}"
            dtype = load_dtype(config, part)
            result.parts[part] = _text_encoder(part, encoder_state, companion, options, what, dtype, readings[part][1])
    return result


def _take(state: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """The tensors under `prefix`, without it, taken out of `state` (so that a part's tensors go once it has them)."""
    return {key[len(prefix) :]: state.pop(key) for key in [k for k in state if k.startswith(prefix)]}


def _config(cls, where: str, subfolder: str, options: dict) -> dict:
    from onetrainer.families.loading import load_diffusers_component

    return dict(load_diffusers_component(cls, where, subfolder, options, config_only=True))


def _text_encoder(
    part: str, state: dict, where: str, options: dict, what: str, dtype: torch.dtype, read_in: torch.dtype | None
) -> torch.nn.Module:
    from transformers import AutoConfig, CLIPTextModelWithProjection, T5EncoderModel

    try:
        encoder_config = AutoConfig.from_pretrained(where, subfolder=part, **options)
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"cannot read the {part} config of {where}: {e}") from e
    cls = T5EncoderModel if part == "text_encoder_3" else CLIPTextModelWithProjection
    if cls is CLIPTextModelWithProjection and "text_projection.weight" not in state:
        # SAI's files hold no CLIP-L projection: it is the identity (diffusers' SD 3 folders hold an identity matrix,
        # ComfyUI starts every CLIP's projection as one)
        state["text_projection.weight"] = torch.eye(encoder_config.hidden_size, encoder_config.projection_dim)
    encoder = empty_module(lambda: cls(encoder_config))
    assign_weights(encoder, as_module_state(encoder, state), dtype, what, read_in)
    if part == "text_encoder_3":  # assigned apart, T5's token tables are tied again: one weight, one gradient
        encoder.encoder.embed_tokens = encoder.shared
    return encoder
