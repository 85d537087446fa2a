"""Anima between diffusers' names and the original checkpoint's (circlestone-labs/Anima's single file, OneTrainer's
ORIGINAL_TRANSFORMER): the Cosmos-Predict2 DiT under `net.` in NVIDIA's module names (`blocks.N.self_attn.q_proj`,
`x_embedder.proj.1`, `final_layer.linear`), its LLM adapter (diffusers' `AnimaTextConditioner`, the same names) beside
it under `net.llm_adapter.`. ComfyUI loads the DiT with `net.` stripped, and its LoRA files name those modules under
`diffusion_model.` (the adapter as `diffusion_model.llm_adapter.`), which diffusers' Anima LoRA loader converts back.
The same tensors under other names: no fused projections, nothing reshaped."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from onetrainer.weights.checkpoint_files import without_prefix

CHECKPOINT_PREFIX = "net."  # the original file's wrapper around the DiT and its adapter
ADAPTER = "llm_adapter."  # the adapter's place in the original model, beside the DiT's modules
# Buffers a Cosmos checkpoint may carry besides the weights (the rotary tables, training counters; diffusers' own
# single-file conversion drops them too)
_NOT_WEIGHTS = ("pos_embedder.", "accum_", "logvar.")

# diffusers' leading module path → the original's
_TOP = (
    ("patch_embed.proj", "x_embedder.proj.1"),
    ("time_embed.t_embedder", "t_embedder.1"),
    ("time_embed.norm", "t_embedding_norm"),
    ("norm_out.linear_1", "final_layer.adaln_modulation.1"),
    ("norm_out.linear_2", "final_layer.adaln_modulation.2"),
    ("proj_out", "final_layer.linear"),
    ("transformer_blocks.", "blocks."),
)
# inside a block: diffusers' → the original's
_BLOCK = (
    ("norm1.linear_1", "adaln_modulation_self_attn.1"),
    ("norm1.linear_2", "adaln_modulation_self_attn.2"),
    ("attn1.norm_q", "self_attn.q_norm"),
    ("attn1.norm_k", "self_attn.k_norm"),
    ("attn1.to_q", "self_attn.q_proj"),
    ("attn1.to_k", "self_attn.k_proj"),
    ("attn1.to_v", "self_attn.v_proj"),
    ("attn1.to_out.0", "self_attn.output_proj"),
    ("norm2.linear_1", "adaln_modulation_cross_attn.1"),
    ("norm2.linear_2", "adaln_modulation_cross_attn.2"),
    ("attn2.norm_q", "cross_attn.q_norm"),
    ("attn2.norm_k", "cross_attn.k_norm"),
    ("attn2.to_q", "cross_attn.q_proj"),
    ("attn2.to_k", "cross_attn.k_proj"),
    ("attn2.to_v", "cross_attn.v_proj"),
    ("attn2.to_out.0", "cross_attn.output_proj"),
    ("norm3.linear_1", "adaln_modulation_mlp.1"),
    ("norm3.linear_2", "adaln_modulation_mlp.2"),
    ("ff.net.0.proj", "mlp.layer1"),
    ("ff.net.2", "mlp.layer2"),
)


def _swap(path: str, table, reverse: bool) -> str:
    for diffusers_name, original_name in table:
        old, new = (original_name, diffusers_name) if reverse else (diffusers_name, original_name)
        if path == old or path.startswith(old + ".") or (old.endswith(".") and path.startswith(old)):
            return new + path[len(old) :]
    return path


def _rename(path: str, reverse: bool = False) -> str:
    blocks = "blocks." if reverse else "transformer_blocks."
    renamed = _swap(path, _TOP, reverse)
    if path.startswith(blocks):
        head, _, rest = renamed.partition(".")
        index, _, inner = rest.partition(".")
        renamed = f"{head}.{index}.{_swap(inner, _BLOCK, reverse)}"
    return renamed


def original_module_path(module_path: str) -> str:
    """A transformer module's path in the original DiT (what ComfyUI's and kohya's LoRA names are made of)."""
    return _rename(module_path)


def to_original(
    transformer: Mapping[str, torch.Tensor], adapter: Mapping[str, torch.Tensor] | None = None
) -> dict[str, torch.Tensor]:
    """The transformer's (and the adapter's) state dicts as the original single file holds them, under `net.`."""
    out = {CHECKPOINT_PREFIX + _rename(key): value for key, value in transformer.items()}
    out.update({CHECKPOINT_PREFIX + ADAPTER + key: value for key, value in (adapter or {}).items()})
    return out


def split_original(state: Mapping[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """An Anima single file (the original's `net.` layout, ComfyUI's prefix or none; or diffusers' transformer names,
    which pass as they are) as the transformer's state dict in diffusers' names and the adapter's (empty where the
    file has none)."""
    state = without_prefix(dict(state), (CHECKPOINT_PREFIX, "model.diffusion_model.", "diffusion_model."))
    state = {k: v for k, v in state.items() if not k.startswith(_NOT_WEIGHTS) and not k.endswith("_extra_state")}
    adapter = {k[len(ADAPTER) :]: v for k, v in state.items() if k.startswith(ADAPTER)}
    rest = {k: v for k, v in state.items() if not k.startswith(ADAPTER)}
    if any(k.startswith("transformer_blocks.") for k in rest):
        return rest, adapter
    return {_rename(key, reverse=True): value for key, value in rest.items()}, adapter
