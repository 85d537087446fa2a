"""Stable Diffusion 3 / 3.5 between diffusers' names and Stability AI's single-file layout (`sd3_medium.safetensors`,
`sd3.5_large.safetensors`), which ComfyUI, Forge and diffusers' `from_single_file` load.

The transformer lives under `model.diffusion_model.` as an MMDiT: `x_embedder`, `t_embedder`, `y_embedder`,
`context_embedder`, `pos_embed`, `joint_blocks.N.x_block` / `.context_block` (the image and text halves of each joint
block, their q/k/v fused in one `attn.qkv`, 3.5's RMS norms as `attn.ln_q` / `ln_k`, 3.5 Medium's second image
attention as `attn2`) and `final_layer`. The final layer's modulation and the last block's text modulation (that block's
text half ends early, so its modulation has two chunks) store shift|scale where diffusers stores scale|shift: their
rows are swapped. The VAE is `first_stage_model.` in LDM names; the text encoders, when the file holds them,
`text_encoders.clip_l.transformer.`, `text_encoders.clip_g.transformer.` and `text_encoders.t5xxl.transformer.` over
transformers' own names.

diffusers converts only the file → diffusers direction (`convert_sd3_transformer_checkpoint_to_diffusers`); this is the
other direction, written from the transformer config so it holds at any width.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

TRANSFORMER_PREFIX = "model.diffusion_model."
VAE_PREFIX = "first_stage_model."
TEXT_ENCODER_PREFIXES = {
    "text_encoder": "text_encoders.clip_l.transformer.",
    "text_encoder_2": "text_encoders.clip_g.transformer.",
    "text_encoder_3": "text_encoders.t5xxl.transformer.",
}


def swap_halves(tensor: torch.Tensor) -> torch.Tensor:
    """scale|shift ↔ shift|scale along the output rows (its own inverse)."""
    first, second = tensor.chunk(2, dim=0)
    return torch.cat([second, first], dim=0)


def transformer_to_original(state: Mapping[str, torch.Tensor], config: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """An `SD3Transformer2DModel` state dict in SAI's names (without the `model.diffusion_model.` prefix); raises
    ValueError naming what it cannot place."""
    left = dict(state)
    out: dict[str, torch.Tensor] = {}

    def move(source: str, target: str, swapped: bool = False) -> None:
        for parameter in ("weight", "bias"):
            value = left.pop(f"{source}.{parameter}", None)
            if value is not None:
                out[f"{target}.{parameter}"] = swap_halves(value) if swapped else value

    def fuse(sources: tuple[str, ...], target: str) -> None:
        for parameter in ("weight", "bias"):
            parts = [left.pop(f"{source}.{parameter}", None) for source in sources]
            if all(part is not None for part in parts):
                out[f"{target}.{parameter}"] = torch.cat(parts, dim=0)
            elif any(part is not None for part in parts):
                raise ValueError(f"{target}.{parameter}: only some of {', '.join(sources)} are there")

    out["pos_embed"] = left.pop("pos_embed.pos_embed")
    move("pos_embed.proj", "x_embedder.proj")
    move("time_text_embed.timestep_embedder.linear_1", "t_embedder.mlp.0")
    move("time_text_embed.timestep_embedder.linear_2", "t_embedder.mlp.2")
    move("time_text_embed.text_embedder.linear_1", "y_embedder.mlp.0")
    move("time_text_embed.text_embedder.linear_2", "y_embedder.mlp.2")
    move("context_embedder", "context_embedder")
    layers = int(config["num_layers"])
    for i in range(layers):
        ours, theirs = f"transformer_blocks.{i}", f"joint_blocks.{i}"
        image, text = f"{theirs}.x_block", f"{theirs}.context_block"
        fuse(tuple(f"{ours}.attn.to_{p}" for p in "qkv"), f"{image}.attn.qkv")
        fuse(tuple(f"{ours}.attn.add_{p}_proj" for p in "qkv"), f"{text}.attn.qkv")
        move(f"{ours}.attn.norm_q", f"{image}.attn.ln_q")
        move(f"{ours}.attn.norm_k", f"{image}.attn.ln_k")
        move(f"{ours}.attn.norm_added_q", f"{text}.attn.ln_q")
        move(f"{ours}.attn.norm_added_k", f"{text}.attn.ln_k")
        move(f"{ours}.attn.to_out.0", f"{image}.attn.proj")
        move(f"{ours}.attn.to_add_out", f"{text}.attn.proj")
        fuse(tuple(f"{ours}.attn2.to_{p}" for p in "qkv"), f"{image}.attn2.qkv")
        move(f"{ours}.attn2.norm_q", f"{image}.attn2.ln_q")
        move(f"{ours}.attn2.norm_k", f"{image}.attn2.ln_k")
        move(f"{ours}.attn2.to_out.0", f"{image}.attn2.proj")
        move(f"{ours}.norm1.linear", f"{image}.adaLN_modulation.1")
        move(f"{ours}.norm1_context.linear", f"{text}.adaLN_modulation.1", swapped=i == layers - 1)
        move(f"{ours}.ff.net.0.proj", f"{image}.mlp.fc1")
        move(f"{ours}.ff.net.2", f"{image}.mlp.fc2")
        move(f"{ours}.ff_context.net.0.proj", f"{text}.mlp.fc1")
        move(f"{ours}.ff_context.net.2", f"{text}.mlp.fc2")
    move("proj_out", "final_layer.linear")
    move("norm_out.linear", "final_layer.adaLN_modulation.1", swapped=True)
    if left:
        raise ValueError(f"{len(left)} transformer weights have no place in the original layout: {sorted(left)[:4]}")
    return out


def text_encoder_to_original(part: str, state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A text encoder's state dict under its `text_encoders.…` prefix: transformers' names, CLIP's under
    `text_model.` (as its checkpoints hold them), T5's tied token table as both `shared` and `encoder.embed_tokens` (as
    SAI's files hold it)."""
    prefix = TEXT_ENCODER_PREFIXES[part]
    out = {}
    for key, value in state.items():
        if part != "text_encoder_3" and not key.startswith(("text_model.", "text_projection.")):
            key = f"text_model.{key}"
        out[prefix + key] = value
    if part == "text_encoder_3" and "shared.weight" in state:
        out[prefix + "encoder.embed_tokens.weight"] = state["shared.weight"].clone()
    return out
