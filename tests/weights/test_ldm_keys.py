"""The diffusers → original (LDM) key maps, checked against diffusers' own original → diffusers converters on the
full-size real topologies (built on the meta device: no memory, every key of a real checkpoint)."""

from __future__ import annotations

import pytest
import torch
from diffusers import AutoencoderKL, UNet2DConditionModel
from diffusers.loaders.single_file_utils import (
    convert_ldm_clip_checkpoint,
    convert_ldm_unet_checkpoint,
    convert_ldm_vae_checkpoint,
    convert_open_clip_checkpoint,
)
from transformers import CLIPTextConfig, CLIPTextModel

from onetrainer.tiny import reference
from onetrainer.weights import ldm_keys


def on_meta(build):
    with torch.device("meta"):
        return build()


def clean(config: dict) -> dict:
    return {k: v for k, v in config.items() if not k.startswith("_")}


@pytest.mark.parametrize(
    "config",
    [reference.SD15_UNET, reference.SD15_INPAINTING_UNET, reference.SD21_768_UNET, reference.SDXL_UNET],
    ids=["sd15", "sd15-inpainting", "sd21-768", "sdxl"],
)
def test_unet_map_is_the_inverse_of_diffusers_converter(config):
    unet = on_meta(lambda: UNet2DConditionModel(**clean(config)))
    state = unet.state_dict()
    original = ldm_keys.unet_to_ldm(state, unet.config)
    assert len(original) == len(state)  # one original key per weight, none merged
    back = convert_ldm_unet_checkpoint({"model.diffusion_model." + k: v for k, v in original.items()}, unet.config)
    assert set(back) == set(state)
    assert all(back[k] is state[k] for k in state)  # each weight lands where it came from


def test_known_original_names():
    unet = on_meta(lambda: UNet2DConditionModel(**clean(reference.SD15_UNET)))
    names = {k: ldm_keys.unet_module_to_ldm(k, unet.config) for k in unet.state_dict()}
    assert names["down_blocks.0.resnets.0.norm1.weight"] == "input_blocks.1.0.in_layers.0.weight"
    assert names["down_blocks.0.downsamplers.0.conv.weight"] == "input_blocks.3.0.op.weight"
    assert names["mid_block.attentions.0.proj_in.weight"] == "middle_block.1.proj_in.weight"
    assert names["up_blocks.1.upsamplers.0.conv.weight"] == "output_blocks.5.2.conv.weight"
    assert names["up_blocks.3.attentions.2.transformer_blocks.0.attn2.to_k.weight"] == (
        "output_blocks.11.1.transformer_blocks.0.attn2.to_k.weight"
    )
    sdxl = on_meta(lambda: UNet2DConditionModel(**clean(reference.SDXL_UNET)))
    assert ldm_keys.unet_module_to_ldm("down_blocks.1.attentions.0.transformer_blocks.1.attn1.to_q", sdxl.config) == (
        "input_blocks.4.1.transformer_blocks.1.attn1.to_q"
    )
    assert ldm_keys.unet_module_to_ldm("add_embedding.linear_1.weight", sdxl.config) == "label_emb.0.0.weight"


def test_vae_map_is_the_inverse_of_diffusers_converter():
    vae = on_meta(lambda: AutoencoderKL(**clean(reference.SD_VAE)))
    state = vae.state_dict()
    original = ldm_keys.vae_to_ldm(state, vae.config)
    assert "decoder.up.3.block.0.conv1.weight" in original and "encoder.mid.attn_1.q.weight" in original
    assert original["encoder.mid.attn_1.q.weight"].shape[-2:] == (1, 1)  # 1x1 convolutions in the original
    back = convert_ldm_vae_checkpoint(original, vae.config)
    assert set(back) == set(state)
    assert all(back[k].shape == state[k].shape for k in state)


def test_clip_l_map():
    encoder = on_meta(lambda: CLIPTextModel(CLIPTextConfig(**clean(reference.CLIP_L_TEXT))))
    state = encoder.state_dict()
    original = ldm_keys.clip_to_ldm(state)
    assert "transformer.text_model.encoder.layers.11.mlp.fc2.weight" in original
    back = convert_ldm_clip_checkpoint({"cond_stage_model." + k: v for k, v in original.items()})
    assert {k.removeprefix("text_model.") for k in back} == {k for k in state if not k.endswith("position_ids")}


def test_open_clip_h_map():
    encoder = on_meta(lambda: CLIPTextModel(CLIPTextConfig(**clean(reference.OPEN_CLIP_H_TEXT))))
    state = encoder.state_dict()
    original = ldm_keys.openclip_to_ldm(state)
    assert original["transformer.resblocks.22.attn.in_proj_weight"].shape == (3 * 1024, 1024)
    assert "positional_embedding" in original and "ln_final.weight" in original
    prefixed = {"cond_stage_model.model." + k: v for k, v in original.items()}
    back = convert_open_clip_checkpoint(encoder, prefixed)
    assert {k.removeprefix("text_model.") for k in back} == {k for k in state if not k.endswith("position_ids")}
