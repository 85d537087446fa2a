"""Flux.1 (dev, schnell, Fill) and Chroma transformers between diffusers' names and the original layout of Black
Forest Labs' checkpoints (`flux1-dev.safetensors`, Chroma's single files), which ComfyUI and Forge load.

The original layout fuses projections that diffusers keeps apart: a double block's image q/k/v are one
`img_attn.qkv` and its text q/k/v one `txt_attn.qkv`; a single block's q/k/v and MLP input are one `linear1`
(rows q|k|v|mlp: 3 × width + 4 × width), its output projection is `linear2`. The final layer's modulation
(`final_layer.adaLN_modulation.1`) stores shift|scale where diffusers' `norm_out.linear` stores scale|shift, so its
rows are swapped both ways. RMS norms are `….scale` there, `….weight` here. Chroma has no per-block modulation layers,
no time/vector/guidance embedders and no final modulation: its `distilled_guidance_layer` (the approximator computing
every modulation) keeps its diffusers name, with `layers.N.in_layer/out_layer` for diffusers' `linear_1/linear_2`.

diffusers converts only original → diffusers (`convert_flux_transformer_checkpoint_to_diffusers`,
`convert_chroma_transformer_checkpoint_to_diffusers`, with Flux.1's width hard-coded); both directions here follow
the transformer config, so they hold at any width. The one map, `module_map`, also names the LoRA modules
(`flux_lora.py`).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from onetrainer.precision.gguf_weights import logical_shape
from onetrainer.weights.checkpoint_files import load_state_dict
from onetrainer.weights.fused_lora import OriginalModule, swap_halves
from onetrainer.weights.key_check import check_keys

# ComfyUI's full checkpoints keep the transformer under this prefix; diffusers' converters strip it too.
COMFY_PREFIX = "model.diffusion_model."
MLP_RATIO = 4  # diffusers' single blocks: the MLP is 4 × the width (not a config field)
FLUX_CLASS = "FluxTransformer2DModel"
CHROMA_CLASS = "ChromaTransformer2DModel"

_PARAMETERS = ("weight", "bias")


def is_chroma(config: Mapping[str, Any]) -> bool:
    """Whether a transformer config is Chroma's (it has the approximator's fields) rather than Flux.1's."""
    return config.get("_class_name") == CHROMA_CLASS or "approximator_layers" in config


def width(config: Mapping[str, Any]) -> int:
    return int(config["num_attention_heads"]) * int(config["attention_head_dim"])


def module_map(config: Mapping[str, Any]) -> dict[str, OriginalModule]:
    """Every diffusers module with a weight and a bias (all of them Linear) → where it lives in the original
    layout, for a Flux.1 or Chroma transformer config (a diffusers config, `dict(transformer.config)`, will do)."""
    return dict(_module_map(_Topology.of(config)))


def original_module(module_path: str, config: Mapping[str, Any]) -> OriginalModule | None:
    """Where one diffusers module lives (`module_map`), None for a module without weight and bias; a lookup in a
    cached map, for naming modules one at a time."""
    return _module_map(_Topology.of(config)).get(module_path)


@dataclass(frozen=True)
class _Topology:
    """What the map depends on: a cache key, so that naming one module at a time costs a lookup."""

    chroma: bool
    width: int
    num_layers: int
    num_single_layers: int
    guidance: bool
    approximator_layers: int

    @staticmethod
    def of(config: Mapping[str, Any]) -> _Topology:
        chroma = is_chroma(config)
        return _Topology(
            chroma,
            width(config),
            int(config["num_layers"]),
            int(config["num_single_layers"]),
            bool(config.get("guidance_embeds")),
            int(config.get("approximator_layers", 5)) if chroma else 0,  # 5: diffusers' default
        )


@functools.lru_cache(maxsize=16)
def _module_map(topology: _Topology) -> dict[str, OriginalModule]:
    inner = topology.width
    qkv = (inner, inner, inner)
    linear1 = (inner, inner, inner, MLP_RATIO * inner)
    modules = {
        "x_embedder": OriginalModule("img_in"),
        "context_embedder": OriginalModule("txt_in"),
        "proj_out": OriginalModule("final_layer.linear"),
    }
    chroma = topology.chroma
    if chroma:
        approximator = "distilled_guidance_layer"
        modules[f"{approximator}.in_proj"] = OriginalModule(f"{approximator}.in_proj")
        modules[f"{approximator}.out_proj"] = OriginalModule(f"{approximator}.out_proj")
        for n in range(topology.approximator_layers):
            for linear, original in (("linear_1", "in_layer"), ("linear_2", "out_layer")):
                modules[f"{approximator}.layers.{n}.{linear}"] = OriginalModule(f"{approximator}.layers.{n}.{original}")
    else:
        embedders = [("timestep_embedder", "time_in"), ("text_embedder", "vector_in")]
        if topology.guidance:
            embedders.append(("guidance_embedder", "guidance_in"))
        for embedder, original in embedders:
            modules[f"time_text_embed.{embedder}.linear_1"] = OriginalModule(f"{original}.in_layer")
            modules[f"time_text_embed.{embedder}.linear_2"] = OriginalModule(f"{original}.out_layer")
        modules["norm_out.linear"] = OriginalModule("final_layer.adaLN_modulation.1", swapped=True)

    for n in range(topology.num_layers):
        block, original = f"transformer_blocks.{n}", f"double_blocks.{n}"
        for index, projection in enumerate(("to_q", "to_k", "to_v")):
            modules[f"{block}.attn.{projection}"] = OriginalModule(f"{original}.img_attn.qkv", index, qkv)
        for index, projection in enumerate(("add_q_proj", "add_k_proj", "add_v_proj")):
            modules[f"{block}.attn.{projection}"] = OriginalModule(f"{original}.txt_attn.qkv", index, qkv)
        modules[f"{block}.attn.to_out.0"] = OriginalModule(f"{original}.img_attn.proj")
        modules[f"{block}.attn.to_add_out"] = OriginalModule(f"{original}.txt_attn.proj")
        for stream, prefix in (("ff", "img"), ("ff_context", "txt")):
            modules[f"{block}.{stream}.net.0.proj"] = OriginalModule(f"{original}.{prefix}_mlp.0")
            modules[f"{block}.{stream}.net.2"] = OriginalModule(f"{original}.{prefix}_mlp.2")
        if not chroma:
            modules[f"{block}.norm1.linear"] = OriginalModule(f"{original}.img_mod.lin")
            modules[f"{block}.norm1_context.linear"] = OriginalModule(f"{original}.txt_mod.lin")

    for n in range(topology.num_single_layers):
        block, original = f"single_transformer_blocks.{n}", f"single_blocks.{n}"
        for index, projection in enumerate(("attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp")):
            modules[f"{block}.{projection}"] = OriginalModule(f"{original}.linear1", index, linear1)
        modules[f"{block}.proj_out"] = OriginalModule(f"{original}.linear2")
        if not chroma:
            modules[f"{block}.norm.linear"] = OriginalModule(f"{original}.modulation.lin")
    return modules


def parameter_map(config: Mapping[str, Any]) -> dict[str, str]:
    """The bare parameters (RMS norm scales): diffusers key → original key."""
    params = {}
    for n in range(config["num_layers"]):
        block, original = f"transformer_blocks.{n}.attn", f"double_blocks.{n}"
        params[f"{block}.norm_q.weight"] = f"{original}.img_attn.norm.query_norm.scale"
        params[f"{block}.norm_k.weight"] = f"{original}.img_attn.norm.key_norm.scale"
        params[f"{block}.norm_added_q.weight"] = f"{original}.txt_attn.norm.query_norm.scale"
        params[f"{block}.norm_added_k.weight"] = f"{original}.txt_attn.norm.key_norm.scale"
    for n in range(config["num_single_layers"]):
        block, original = f"single_transformer_blocks.{n}.attn", f"single_blocks.{n}"
        params[f"{block}.norm_q.weight"] = f"{original}.norm.query_norm.scale"
        params[f"{block}.norm_k.weight"] = f"{original}.norm.key_norm.scale"
    if is_chroma(config):
        for n in range(_Topology.of(config).approximator_layers):
            params[f"distilled_guidance_layer.norms.{n}.weight"] = f"distilled_guidance_layer.norms.{n}.scale"
    return params


def diffusers_keys(config: Mapping[str, Any]) -> set[str]:
    """The keys of a diffusers Flux / Chroma transformer's state dict."""
    keys = {f"{module}.{p}" for module in module_map(config) for p in _PARAMETERS}
    return keys | set(parameter_map(config))


def original_keys(config: Mapping[str, Any]) -> set[str]:
    """The keys of the original checkpoint (without ComfyUI's `model.diffusion_model.` prefix)."""
    keys = {f"{m.path}.{p}" for m in module_map(config).values() for p in _PARAMETERS}
    return keys | set(parameter_map(config).values())


def diffusers_to_original(state_dict: Mapping[str, torch.Tensor], config: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """A diffusers transformer state dict → the original layout (fused q/k/v and linear1, swapped final
    modulation); every key of the config must be there, and nothing else."""
    check_keys(state_dict, diffusers_keys(config), "diffusers Flux/Chroma transformer")
    out: dict[str, torch.Tensor] = {}
    fused: dict[str, list[torch.Tensor | None]] = {}
    for module, original in module_map(config).items():
        for p in _PARAMETERS:
            value = state_dict[f"{module}.{p}"]
            if original.swapped:
                value = swap_halves(value)
            if original.fused:
                fused.setdefault(f"{original.path}.{p}", [None] * len(original.rows))[original.index] = value
            else:
                out[f"{original.path}.{p}"] = value
    for key, slices in fused.items():
        out[key] = torch.cat(slices, dim=0)  # every slot is filled: check_keys saw every diffusers key
    for diffusers_key, original_key in parameter_map(config).items():
        out[original_key] = state_dict[diffusers_key]
    return out


def strip_comfy_prefix(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The state dict without ComfyUI's `model.diffusion_model.` prefix (a full checkpoint's other parts, e.g. a
    bundled VAE or text encoder, are dropped)."""
    if not any(key.startswith(COMFY_PREFIX) for key in state_dict):
        return dict(state_dict)
    return {k[len(COMFY_PREFIX) :]: v for k, v in state_dict.items() if k.startswith(COMFY_PREFIX)}


def original_to_diffusers(state_dict: Mapping[str, torch.Tensor], config: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """An original state dict (with or without `model.diffusion_model.`) → the diffusers state dict of a transformer
    with `config`. The projections are views of the fused tensors (no copy). Every key must match the config
    exactly, or the error lists what is missing and what is left over."""
    weights = strip_comfy_prefix(state_dict)
    check_keys(weights, original_keys(config), "Flux/Chroma checkpoint")
    out: dict[str, torch.Tensor] = {}
    for module, original in module_map(config).items():
        for p in _PARAMETERS:
            key = f"{original.path}.{p}"
            value = weights[key]
            if original.fused:
                if value.shape[0] != sum(original.rows):
                    raise ValueError(
                        f"{key} has {value.shape[0]} rows, not the {sum(original.rows)} of this configuration's "
                        f"width {width(config)}"
                    )
                value = value[original.start : original.start + original.rows[original.index]]
            if original.swapped:
                value = swap_halves(value)
            out[f"{module}.{p}"] = value
    for diffusers_key, original_key in parameter_map(config).items():
        out[diffusers_key] = weights[original_key]
    return out


def original_topology(state_dict: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    """The transformer config fields an original checkpoint determines, by its keys and shapes: `_class_name`
    (Flux.1 or Chroma), layer counts, widths, channels (`out_channels` None where it equals `in_channels`, as the
    released configs say it), and Flux's `guidance_embeds` (dev and Fill have the embedder, schnell not) or Chroma's
    approximator sizes. `axes_dims_rope` and `patch_size` are not stored in the weights: merge this over the
    released config of the model type (`{**reference, **original_topology(sd)}`)."""
    weights = strip_comfy_prefix(state_dict)
    if "img_in.weight" not in weights or "txt_in.weight" not in weights:
        raise ValueError("not a Flux/Chroma checkpoint: it has no img_in.weight / txt_in.weight")
    inner, in_channels = (int(n) for n in logical_shape(weights["img_in.weight"]))
    out_channels = (
        int(logical_shape(weights["final_layer.linear.weight"])[0]) if "final_layer.linear.weight" in weights else 0
    )
    norm = next((v for k, v in weights.items() if k.endswith(".norm.query_norm.scale")), None)
    if norm is None:
        raise ValueError("not a Flux/Chroma checkpoint: it has no attention norms (…query_norm.scale)")
    head = int(logical_shape(norm)[0])
    topology: dict[str, Any] = {
        "_class_name": CHROMA_CLASS if "distilled_guidance_layer.in_proj.weight" in weights else FLUX_CLASS,
        "num_layers": _count(weights, "double_blocks."),
        "num_single_layers": _count(weights, "single_blocks."),
        "in_channels": in_channels,
        "out_channels": None if out_channels in (0, in_channels) else out_channels,
        "attention_head_dim": head,
        "num_attention_heads": inner // head,
        "joint_attention_dim": int(logical_shape(weights["txt_in.weight"])[1]),
    }
    if topology["_class_name"] == CHROMA_CLASS:
        hidden, channels = (int(n) for n in logical_shape(weights["distilled_guidance_layer.in_proj.weight"]))
        topology["approximator_num_channels"] = channels
        topology["approximator_hidden_dim"] = hidden
        topology["approximator_layers"] = _count(weights, "distilled_guidance_layer.layers.")
    else:
        topology["pooled_projection_dim"] = int(logical_shape(weights["vector_in.in_layer.weight"])[1])
        topology["guidance_embeds"] = "guidance_in.in_layer.weight" in weights
    return topology


def read_original_checkpoint(
    path: str | os.PathLike, reference: Mapping[str, Any], dtype: torch.dtype | None = None
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """An original Flux.1 / Chroma single file (safetensors, or a pickle read without running code) → (the
    diffusers state dict, its floating tensors read in `dtype` (None: as stored), the transformer config: `reference`,
    the released config of the model type, with what the file determines, `original_topology`, over it). A Chroma
    file for a Flux.1 reference (or the reverse) is refused; a Fill file for the dev reference is not (compare
    `in_channels`). Errors name the file."""
    return convert_original(load_state_dict(path, dtype), reference, path)  # its errors name the file already


def convert_original(
    state_dict: Mapping[str, torch.Tensor], reference: Mapping[str, Any], path: str | os.PathLike
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """`read_original_checkpoint` for a state dict already read (a GGUF file's: its quantized tensors keep their
    type through the row slicing); errors name `path`."""
    try:
        topology = original_topology(state_dict)
        expected = reference.get("_class_name")
        if expected is not None and expected != topology["_class_name"]:
            kinds = {FLUX_CLASS: "Flux.1", CHROMA_CLASS: "Chroma"}
            raise ValueError(
                f"a {kinds[topology['_class_name']]} checkpoint, not a {kinds.get(expected, expected)} one"
            )
        config = {**reference, **topology}
        return original_to_diffusers(state_dict, config), config
    except (KeyError, ValueError) as error:
        raise ValueError(f"{os.fspath(path)}: {error}") from error


def _count(weights: Mapping[str, torch.Tensor], prefix: str) -> int:
    """The number of numbered blocks under `prefix` (`double_blocks.` → 19)."""
    indices = {int(k[len(prefix) :].split(".", 1)[0]) for k in weights if k.startswith(prefix)}
    return max(indices) + 1 if indices else 0
