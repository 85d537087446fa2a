"""Flux.1 and Chroma transformers for the key-map tests: the released configs, tiny models of the real topology (19
double and 38 single blocks, Chroma's 5 approximator layers) at tiny width, full-size models on the meta device,
and diffusers' own converters run at the tiny width.

diffusers' converters hard-code Flux.1's width (`inner_dim = 3072` in the single-file converters, `dims=[3072, 3072,
3072, 12288]` for `linear1` in the kohya LoRA converter), so at tiny width they cannot run as they are. `at_width`
recompiles a converter from its own source with only those constants replaced (each must occur exactly once, so a
diffusers change fails loudly); everything else is diffusers' code.
"""

from __future__ import annotations

import inspect
import textwrap
from collections.abc import Callable
from typing import Any

import torch

from onetrainer.families import reference_configs

Config = dict[str, Any]

# The transformers' config.json of the released models (diffusers folders), as the estimate builds them.
FLUX_DEV: Config = reference_configs.FLUX_DEV_TRANSFORMER
FLUX_SCHNELL: Config = reference_configs.FLUX_SCHNELL_TRANSFORMER
FLUX_FILL: Config = reference_configs.FLUX_FILL_TRANSFORMER
CHROMA: Config = reference_configs.CHROMA_TRANSFORMER
RELEASED = {"dev": FLUX_DEV, "schnell": FLUX_SCHNELL, "fill": FLUX_FILL, "chroma": CHROMA}

HEADS, HEAD_WIDTH = 3, 8
WIDTH = HEADS * HEAD_WIDTH  # 24: q, k, v 24 rows each, the single blocks' MLP 96
TEXT_WIDTH = 32  # the tiny T5's and CLIP's widths
# Only widths change: the rotary axes must add up to the head width; Chroma's approximator input (64 sin-cos
# channels) is not a width and stays.
TINY_WIDTHS = {
    "num_attention_heads": HEADS,
    "attention_head_dim": HEAD_WIDTH,
    "axes_dims_rope": [2, 2, 4],
    "joint_attention_dim": TEXT_WIDTH,
}


def tiny(real: Config) -> Config:
    widths = dict(TINY_WIDTHS)
    if "pooled_projection_dim" in real:
        widths["pooled_projection_dim"] = TEXT_WIDTH
    if "approximator_hidden_dim" in real:
        widths["approximator_hidden_dim"] = 2 * WIDTH
    return {**real, **widths}


def model_class(config: Config) -> type[torch.nn.Module]:
    import diffusers

    return getattr(diffusers, config["_class_name"])


def build(config: Config, seed: int = 0) -> torch.nn.Module:
    """A model with random weights (every norm scale too: diffusers initialises them to one, which would hide a
    mix-up between norms)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_class(config)(**{k: v for k, v in config.items() if not k.startswith("_")}).eval()
        with torch.no_grad():
            for name, parameter in model.named_parameters():
                if parameter.dim() == 1 and "norm" in name:
                    parameter.copy_(torch.rand_like(parameter) + 0.5)
    return model


def meta_model(config: Config) -> torch.nn.Module:
    """The full-size model on the meta device: names and shapes, no memory."""
    with torch.device("meta"):
        return model_class(config)(**{k: v for k, v in config.items() if not k.startswith("_")})


def inputs(config: Config, seed: int = 0, batch: int = 2) -> dict[str, torch.Tensor]:
    """A forward pass's arguments: 16 image tokens (a 4×4 packed latent), 6 text tokens."""
    generator = torch.Generator().manual_seed(seed)
    image_tokens, text_tokens = 16, 6
    args = {
        "hidden_states": torch.randn(batch, image_tokens, config["in_channels"], generator=generator),
        "encoder_hidden_states": torch.randn(batch, text_tokens, config["joint_attention_dim"], generator=generator),
        "timestep": torch.rand(batch, generator=generator),
        "img_ids": torch.stack([torch.zeros(16), torch.arange(16) // 4, torch.arange(16) % 4], dim=-1).float(),
        "txt_ids": torch.zeros(text_tokens, 3),
        "return_dict": False,
    }
    if "pooled_projection_dim" in config:
        args["pooled_projections"] = torch.randn(batch, config["pooled_projection_dim"], generator=generator)
    if config.get("guidance_embeds"):
        args["guidance"] = torch.full((batch,), 3.5)
    return args


def at_width(function: Callable, replacements: dict[str, str]) -> Callable:
    """`function` recompiled from its own source with `replacements` made (each text found exactly once), in its
    module's namespace."""
    source = textwrap.dedent(inspect.getsource(function))
    for old, new in replacements.items():
        assert source.count(old) == 1, f"{function.__name__} no longer has exactly one {old!r}"
        source = source.replace(old, new)
    namespace = dict(function.__globals__)
    exec(compile(source, inspect.getsourcefile(function), "exec"), namespace)
    return namespace[function.__name__]


def single_file_converter(config: Config) -> Callable:
    """diffusers' original → diffusers converter for this model, at the config's width."""
    from diffusers.loaders import single_file_utils as utils

    converter = (
        utils.convert_chroma_transformer_checkpoint_to_diffusers
        if config["_class_name"] == "ChromaTransformer2DModel"
        else utils.convert_flux_transformer_checkpoint_to_diffusers
    )
    width = config["num_attention_heads"] * config["attention_head_dim"]
    return converter if width == 3072 else at_width(converter, {"inner_dim = 3072": f"inner_dim = {width}"})


def kohya_lora_converter(config: Config) -> Callable:
    """diffusers' kohya → peft Flux LoRA converter (also Chroma's), at the config's width."""
    from diffusers.loaders import lora_conversion_utils as utils

    width = config["num_attention_heads"] * config["attention_head_dim"]
    converter = utils._convert_kohya_flux_lora_to_diffusers
    if width == 3072:
        return converter
    dims = f"dims=[{width}, {width}, {width}, {4 * width}]"
    return at_width(converter, {"dims=[3072, 3072, 3072, 12288]": dims})
