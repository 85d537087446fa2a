"""Wan's transformer modules between diffusers' names and Wan's own (the original checkpoints' layout, which ComfyUI's
model and musubi-tuner name LoRA modules by): `blocks.N.attn1.to_q` is `blocks.N.self_attn.q`, `attn2` is
`cross_attn`, the feed-forward's `ffn.net.0.proj` / `ffn.net.2` are `ffn.0` / `ffn.2`, the condition embedder's
layers are `text_embedding.*`, `time_embedding.*` and `time_projection.1`, the output layer `head.head`.

ComfyUI's LoRA layout (COMFY_LORA) is `diffusion_model.` + such a path, musubi-tuner's (KOHYA_LORA) `lora_unet_` + the
path with underscores; diffusers' `WanLoraLoaderMixin` converts both back to its names.

The whole transformer in Wan's names (`original_state` / `diffusers_state`) is the single file Wan's own code, ComfyUI's
repackaged `split_files/diffusion_models/wan2.*.safetensors` and diffusers' `WanTransformer3DModel.from_single_file`
read: the modules as above, and the modulation tables, diffusers' `scale_shift_table`s, as `blocks.N.modulation` and
`head.modulation`."""

from __future__ import annotations

import re

# inside a block: diffusers' module → Wan's
_BLOCK = (
    ("attn1.to_q", "self_attn.q"),
    ("attn1.to_k", "self_attn.k"),
    ("attn1.to_v", "self_attn.v"),
    ("attn1.to_out.0", "self_attn.o"),
    ("attn1.norm_q", "self_attn.norm_q"),
    ("attn1.norm_k", "self_attn.norm_k"),
    ("attn2.to_q", "cross_attn.q"),
    ("attn2.to_k", "cross_attn.k"),
    ("attn2.to_v", "cross_attn.v"),
    ("attn2.to_out.0", "cross_attn.o"),
    ("attn2.norm_q", "cross_attn.norm_q"),
    ("attn2.norm_k", "cross_attn.norm_k"),
    ("attn2.add_k_proj", "cross_attn.k_img"),
    ("attn2.add_v_proj", "cross_attn.v_img"),
    ("attn2.norm_added_k", "cross_attn.norm_k_img"),
    ("ffn.net.0.proj", "ffn.0"),
    ("ffn.net.2", "ffn.2"),
    ("norm2", "norm3"),  # the cross-attention's norm
)
# outside the blocks: diffusers' module → Wan's
_TOP = (
    ("condition_embedder.text_embedder.linear_1", "text_embedding.0"),
    ("condition_embedder.text_embedder.linear_2", "text_embedding.2"),
    ("condition_embedder.time_embedder.linear_1", "time_embedding.0"),
    ("condition_embedder.time_embedder.linear_2", "time_embedding.2"),
    ("condition_embedder.time_proj", "time_projection.1"),
    ("proj_out", "head.head"),
    # Wan 2.1 I2V's projection of the CLIP image states (`img_emb.proj`: LayerNorm, Linear, GELU, Linear, LayerNorm)
    ("condition_embedder.image_embedder.norm1", "img_emb.proj.0"),
    ("condition_embedder.image_embedder.ff.net.0.proj", "img_emb.proj.1"),
    ("condition_embedder.image_embedder.ff.net.2", "img_emb.proj.3"),
    ("condition_embedder.image_embedder.norm2", "img_emb.proj.4"),
    ("patch_embedding", "patch_embedding"),
)
_IN_BLOCK = re.compile(r"^(blocks\.\d+)\.(.+)$")


def original_module_path(path: str) -> str:
    """A module's path in Wan's own names (diffusers' path where Wan has no other)."""
    match = _IN_BLOCK.match(path)
    if match:
        block, rest = match.groups()
        for ours, theirs in _BLOCK:
            if rest == ours or rest.startswith(ours + "."):
                return f"{block}.{theirs}{rest[len(ours) :]}"
        return path
    for ours, theirs in _TOP:
        if path == ours or path.startswith(ours + "."):
            return theirs + path[len(ours) :]
    return path


_PARAMETERS = {"scale_shift_table": "head.modulation"}  # diffusers' parameter outside the blocks → Wan's
_BLOCK_PARAMETERS = {"scale_shift_table": "modulation"}  # inside a block
COMFY_PREFIX = "model.diffusion_model."  # a ComfyUI checkpoint's transformer keys


def original_key(key: str) -> str:
    """A diffusers state-dict key of the transformer in Wan's names."""
    match = _IN_BLOCK.match(key)
    if match and match.group(2) in _BLOCK_PARAMETERS:
        return f"{match.group(1)}.{_BLOCK_PARAMETERS[match.group(2)]}"
    if key in _PARAMETERS:
        return _PARAMETERS[key]
    module, dot, name = key.rpartition(".")
    return f"{original_module_path(module)}{dot}{name}" if module else key


def original_state(state: dict) -> dict:
    """The transformer's state dict (diffusers' names) in Wan's names."""
    return {original_key(key): value for key, value in state.items()}


def diffusers_state(state: dict) -> dict:
    """A single file of the transformer in Wan's names (a ComfyUI checkpoint's `model.diffusion_model.` prefix
    allowed) in diffusers' names; a key in neither layout is a ValueError naming it."""
    inverse_block = {theirs: ours for ours, theirs in _BLOCK} | {v: k for k, v in _BLOCK_PARAMETERS.items()}
    inverse_top = {theirs: ours for ours, theirs in _TOP} | {v: k for k, v in _PARAMETERS.items()}
    out = {}
    for key, value in state.items():
        key = key.removeprefix(COMFY_PREFIX)
        match = _IN_BLOCK.match(key)
        table = inverse_block if match else inverse_top
        block, rest = (match.group(1) + ".", match.group(2)) if match else ("", key)
        for theirs in sorted(table, key=len, reverse=True):
            if rest == theirs or rest.startswith(theirs + "."):
                rest = table[theirs] + rest[len(theirs) :]
                break
        else:
            if not (match and rest.startswith(("norm1.", "norm2.", "norm3."))) and not rest.startswith(
                "patch_embedding."
            ):
                raise ValueError(f"{key} is no key of Wan's transformer")
        out[block + rest] = value
    return out
