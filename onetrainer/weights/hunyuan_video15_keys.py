"""HunyuanVideo 1.5's transformer as ComfyUI's model names it (its HunyuanVideo model: Flux's double-stream blocks,
HunyuanVideo's token refiner), for COMFY_LORA files: each stream's q, k and v one fused `img_attn.qkv` /
`txt_attn.qkv` projection (q, k, v stacked in that order along the output), the refiner's `self_attn.qkv` likewise,
the feed-forwards `img_mlp.0` / `img_mlp.2`, the modulations `img_mod.lin`, the final modulation's shift and scale
stored the other way round from diffusers'. ComfyUI maps `diffusion_model.<its module path>` onto its weights for any
model (`weights/fused_transformer_lora.FusedLayout` writes the fused LoRA)."""

from __future__ import annotations

import functools

SPLIT = ("to_q", "to_k", "to_v")
ADDED = ("add_q_proj", "add_k_proj", "add_v_proj")

# The transformer's linear modules outside the blocks: diffusers path → ComfyUI's.
_TOP_LEVEL = {
    "x_embedder.proj": "img_in.proj",
    "image_embedder.linear_1": "vision_in.proj.1",
    "image_embedder.linear_2": "vision_in.proj.3",
    "context_embedder.proj_in": "txt_in.input_embedder",
    "context_embedder.time_text_embed.timestep_embedder.linear_1": "txt_in.t_embedder.in_layer",
    "context_embedder.time_text_embed.timestep_embedder.linear_2": "txt_in.t_embedder.out_layer",
    "context_embedder.time_text_embed.text_embedder.linear_1": "txt_in.c_embedder.in_layer",
    "context_embedder.time_text_embed.text_embedder.linear_2": "txt_in.c_embedder.out_layer",
    "context_embedder_2.linear_1": "byt5_in.fc1",
    "context_embedder_2.linear_2": "byt5_in.fc2",
    "context_embedder_2.linear_3": "byt5_in.fc3",
    "time_embed.timestep_embedder.linear_1": "time_in.in_layer",
    "time_embed.timestep_embedder.linear_2": "time_in.out_layer",
    "proj_out": "final_layer.linear",
}
# Per dual-stream block: diffusers' module → ComfyUI's (q/k/v apart).
_BLOCK = {
    "attn.to_out.0": "img_attn.proj",
    "attn.to_add_out": "txt_attn.proj",
    "ff.net.0.proj": "img_mlp.0",
    "ff.net.2": "img_mlp.2",
    "ff_context.net.0.proj": "txt_mlp.0",
    "ff_context.net.2": "txt_mlp.2",
    "norm1.linear": "img_mod.lin",
    "norm1_context.linear": "txt_mod.lin",
}
_REFINER = {
    "attn.to_out.0": "self_attn.proj",
    "ff.net.0.proj": "mlp.0",
    "ff.net.2": "mlp.2",
    "norm_out.linear": "adaLN_modulation.1",
}


def module_map(config) -> dict:
    """Every linear (and the patch embedding's) module of the transformer (diffusers path) → where its output rows live
    in ComfyUI's model, for a diffusers config."""
    width = int(config["num_attention_heads"]) * int(config["attention_head_dim"])
    return dict(_module_map(width, int(config["num_layers"]), int(config["num_refiner_layers"])))


def original_module(module_path: str, config):
    """Where one diffusers module lives (`module_map`), None for one outside it."""
    return module_map(config).get(module_path)


@functools.lru_cache(maxsize=16)
def _module_map(width: int, num_layers: int, num_refiner_layers: int) -> dict:
    from onetrainer.weights.fused_lora import OriginalModule

    modules = {path: OriginalModule(comfy) for path, comfy in _TOP_LEVEL.items()}
    # diffusers' final modulation gives (scale, shift), ComfyUI's (shift, scale)
    modules["norm_out.linear"] = OriginalModule("final_layer.adaLN_modulation.1", swapped=True)
    thirds = (width,) * 3
    for i in range(num_layers):
        block, ours = f"double_blocks.{i}", f"transformer_blocks.{i}"
        for index, (q, added) in enumerate(zip(SPLIT, ADDED)):
            modules[f"{ours}.attn.{q}"] = OriginalModule(f"{block}.img_attn.qkv", index, thirds)
            modules[f"{ours}.attn.{added}"] = OriginalModule(f"{block}.txt_attn.qkv", index, thirds)
        for name, comfy in _BLOCK.items():
            modules[f"{ours}.{name}"] = OriginalModule(f"{block}.{comfy}")
    for j in range(num_refiner_layers):
        block = f"txt_in.individual_token_refiner.blocks.{j}"
        ours = f"context_embedder.token_refiner.refiner_blocks.{j}"
        for index, q in enumerate(SPLIT):
            modules[f"{ours}.attn.{q}"] = OriginalModule(f"{block}.self_attn.qkv", index, thirds)
        for name, comfy in _REFINER.items():
            modules[f"{ours}.{name}"] = OriginalModule(f"{block}.{comfy}")
    return modules
