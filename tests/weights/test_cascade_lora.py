"""Stage C LoRA names (LEGACY_LORA, KOHYA_LORA) on the lite topology and the prior's text encoder, at tiny width."""

from __future__ import annotations

from functools import cache

import pytest
import torch
from transformers import CLIPTextModelWithProjection

from onetrainer.tiny import TINY_VARIANTS, components
from onetrainer.tiny import reference as ref
from onetrainer.tiny.cascade import build_prior_unet
from onetrainer.weights import cascade_keys
from onetrainer.weights import cascade_lora as cl


@cache
def prior() -> torch.nn.Module:
    return build_prior_unet(ref.CASCADE_PRIOR_LITE_UNET, seed=0)


@cache
def text_encoder() -> CLIPTextModelWithProjection:
    return components.build_clip_text(TINY_VARIANTS["cascade"].references, 0)[1]


def comfyui_stage_c_lora_names(prefix: str) -> set[str]:
    """What ComfyUI maps for stage C: its model's `.weight` keys (Stability's, with in_proj split into to_q/k/v)
    as `<prefix>_<key without .weight, dots as underscores>`."""
    stability = cascade_keys.to_stability(prior().state_dict(), prior().config)
    keys: list[str] = []
    for key in stability:
        if key.endswith(".attn.in_proj_weight"):
            keys += [key.replace("in_proj_weight", f"to_{n}.weight") for n in "qkv"]
        elif key.endswith(".weight"):
            keys.append(key)
    return {f"{prefix}_{k[: -len('.weight')].replace('.', '_')}" for k in keys}


@pytest.mark.parametrize(("legacy", "prefix"), [(True, "lora_prior_unet"), (False, "lora_unet")])
def test_every_adaptable_prior_module_gets_a_unique_name_comfyui_maps(legacy: bool, prefix: str) -> None:
    paths = cl.adaptable_modules(prior())
    names = cl.lora_name_map(paths, lambda p: cl.prior_lora_name(p, legacy))
    assert len(names) == len(paths)
    assert set(names) <= comfyui_stage_c_lora_names(prefix)
    assert sorted(names.values()) == sorted(paths)  # the round trip back to the module
    assert names[f"{prefix}_down_blocks_0_2_attention_attn_to_q"] == "down_blocks.0.2.attention.to_q"
    assert names[f"{prefix}_up_blocks_1_5_attention_attn_out_proj"] == "up_blocks.1.5.attention.to_out.0"


def test_grouped_convolutions_are_not_adaptable() -> None:
    paths = set(cl.adaptable_modules(prior()))
    depthwise = [n for n, m in prior().named_modules() if isinstance(m, torch.nn.Conv2d) and m.groups > 1]
    assert depthwise and not paths & set(depthwise)
    assert "embedding.1" in paths and "down_blocks.1.0.channelwise.0" in paths


def test_native_paths_round_trip() -> None:
    for path in cl.adaptable_modules(prior()):
        native = cl.native_module_path(path)
        assert ".to_out" not in native and cl.diffusers_module_path(native) == path
    assert cl.native_module_path("down_blocks.0.2.attention.to_v") == "down_blocks.0.2.attention.attn.to_v"
    assert cl.native_module_path("down_blocks.0.2.kv_mapper.1") == "down_blocks.0.2.kv_mapper.1"


@pytest.mark.parametrize(("legacy", "prefix"), [(True, "lora_prior_te"), (False, "lora_te")])
def test_text_encoder_names(legacy: bool, prefix: str) -> None:
    paths = cl.adaptable_modules(text_encoder())
    names = cl.lora_name_map(paths, lambda p: cl.text_encoder_lora_name(p, legacy))
    assert sorted(names.values()) == sorted(paths)
    # ComfyUI maps the encoder layers' attention and MLP projections for clip_g under these names.
    layers = text_encoder().config.num_hidden_layers
    for layer in (0, layers - 1):
        for module in ("self_attn_q_proj", "self_attn_k_proj", "self_attn_v_proj", "self_attn_out_proj", "mlp_fc1"):
            assert f"{prefix}_text_model_encoder_layers_{layer}_{module}" in names


def test_colliding_names_are_refused() -> None:
    with pytest.raises(ValueError, match=r"a\.b_c and a_b\.c would both be saved as lora_unet_a_b_c"):
        cl.lora_name_map(["a.b_c", "a_b.c"], lambda p: cl.prior_lora_name(p, legacy=False))
