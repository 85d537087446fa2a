"""HunyuanVideo's transformer: where each diffusers module lives in the original (Tencent) checkpoint's layout, the
names musubi-tuner's and diffusion-pipe's LoRA files use and ComfyUI maps (`comfy/lora.py`: `diffusion_model.` /
`transformer.` + these paths), as diffusers' `_convert_hunyuan_video_lora_to_diffusers` reads them back.

Fused in the original: a double block's image q/k/v (`img_attn_qkv`) and text q/k/v (`txt_attn_qkv`), a single block's
q/k/v and MLP input (`linear1`: 3 × width + the MLP's width), a token-refiner block's q/k/v (`self_attn_qkv`). The final
layer's modulation (`final_layer.adaLN_modulation.1`) stores shift|scale where diffusers' `norm_out.linear` has
scale|shift; the refiner blocks' modulation is not swapped.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from onetrainer.weights.fused_lora import OriginalModule


def module_map(config: Mapping[str, Any]) -> dict[str, OriginalModule]:
    """Every adaptable (Linear) diffusers module of a HunyuanVideo transformer config → where it lives in the original
    layout."""
    return dict(_module_map(_Topology.of(config)))


def original_module(module_path: str, config: Mapping[str, Any]) -> OriginalModule | None:
    """Where one diffusers module lives (`module_map`), None for a module outside it."""
    return _module_map(_Topology.of(config)).get(module_path)


@dataclass(frozen=True)
class _Topology:
    width: int
    mlp_width: int
    num_layers: int
    num_single_layers: int
    num_refiner_layers: int
    guidance: bool

    @staticmethod
    def of(config: Mapping[str, Any]) -> _Topology:
        width = int(config["num_attention_heads"]) * int(config["attention_head_dim"])
        return _Topology(
            width,
            int(width * float(config.get("mlp_ratio", 4.0))),
            int(config["num_layers"]),
            int(config["num_single_layers"]),
            int(config.get("num_refiner_layers", 2)),
            bool(config.get("guidance_embeds", True)),
        )


@functools.lru_cache(maxsize=16)
def _module_map(topology: _Topology) -> dict[str, OriginalModule]:
    width = topology.width
    qkv = (width, width, width)
    modules = {
        "context_embedder.proj_in": OriginalModule("txt_in.input_embedder"),
        "norm_out.linear": OriginalModule("final_layer.adaLN_modulation.1", swapped=True),
        "proj_out": OriginalModule("final_layer.linear"),
    }
    for index, linear in enumerate(("linear_1", "linear_2")):
        mlp = f"mlp.{2 * index}"
        modules[f"context_embedder.time_text_embed.timestep_embedder.{linear}"] = OriginalModule(
            f"txt_in.t_embedder.{mlp}"
        )
        modules[f"context_embedder.time_text_embed.text_embedder.{linear}"] = OriginalModule(
            f"txt_in.c_embedder.{linear}"
        )
        modules[f"time_text_embed.timestep_embedder.{linear}"] = OriginalModule(f"time_in.{mlp}")
        if topology.guidance:
            modules[f"time_text_embed.guidance_embedder.{linear}"] = OriginalModule(f"guidance_in.{mlp}")
        vector = ("in_layer", "out_layer")[index]
        modules[f"time_text_embed.text_embedder.{linear}"] = OriginalModule(f"vector_in.{vector}")

    for n in range(topology.num_refiner_layers):
        block = f"context_embedder.token_refiner.refiner_blocks.{n}"
        original = f"txt_in.individual_token_refiner.blocks.{n}"
        for index, projection in enumerate(("to_q", "to_k", "to_v")):
            modules[f"{block}.attn.{projection}"] = OriginalModule(f"{original}.self_attn_qkv", index, qkv)
        modules[f"{block}.attn.to_out.0"] = OriginalModule(f"{original}.self_attn_proj")
        modules[f"{block}.ff.net.0.proj"] = OriginalModule(f"{original}.mlp.fc1")
        modules[f"{block}.ff.net.2"] = OriginalModule(f"{original}.mlp.fc2")
        modules[f"{block}.norm_out.linear"] = OriginalModule(f"{original}.adaLN_modulation.1")

    for n in range(topology.num_layers):
        block, original = f"transformer_blocks.{n}", f"double_blocks.{n}"
        for index, projection in enumerate(("to_q", "to_k", "to_v")):
            modules[f"{block}.attn.{projection}"] = OriginalModule(f"{original}.img_attn_qkv", index, qkv)
        for index, projection in enumerate(("add_q_proj", "add_k_proj", "add_v_proj")):
            modules[f"{block}.attn.{projection}"] = OriginalModule(f"{original}.txt_attn_qkv", index, qkv)
        modules[f"{block}.attn.to_out.0"] = OriginalModule(f"{original}.img_attn_proj")
        modules[f"{block}.attn.to_add_out"] = OriginalModule(f"{original}.txt_attn_proj")
        for stream, prefix in (("ff", "img"), ("ff_context", "txt")):
            modules[f"{block}.{stream}.net.0.proj"] = OriginalModule(f"{original}.{prefix}_mlp.fc1")
            modules[f"{block}.{stream}.net.2"] = OriginalModule(f"{original}.{prefix}_mlp.fc2")
        modules[f"{block}.norm1.linear"] = OriginalModule(f"{original}.img_mod.linear")
        modules[f"{block}.norm1_context.linear"] = OriginalModule(f"{original}.txt_mod.linear")

    linear1 = (width, width, width, topology.mlp_width)
    for n in range(topology.num_single_layers):
        block, original = f"single_transformer_blocks.{n}", f"single_blocks.{n}"
        for index, projection in enumerate(("attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp")):
            modules[f"{block}.{projection}"] = OriginalModule(f"{original}.linear1", index, linear1)
        modules[f"{block}.proj_out"] = OriginalModule(f"{original}.linear2")
        modules[f"{block}.norm.linear"] = OriginalModule(f"{original}.modulation.linear")
    return modules
