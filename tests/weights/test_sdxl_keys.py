"""SDXL's original (SGM) single-file layout and kohya LoRA names, checked on the full-size real topologies (built on
the meta device) against diffusers' own readers: its single-file converters and its kohya LoRA converter."""

from __future__ import annotations

import types

import pytest
import torch
from diffusers import AutoencoderKL, StableDiffusionXLPipeline, UNet2DConditionModel
from diffusers.loaders.single_file_utils import (
    convert_ldm_clip_checkpoint,
    convert_ldm_unet_checkpoint,
    convert_ldm_vae_checkpoint,
    convert_open_clip_checkpoint,
    infer_diffusers_model_type,
)
from diffusers.utils import convert_unet_state_dict_to_peft
from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

from onetrainer.families.sdxl import CLIP_G_PREFIX, StableDiffusionXLFamily, to_original
from onetrainer.tiny import reference

FAMILY = StableDiffusionXLFamily()
ADAPTABLE = (torch.nn.Linear, torch.nn.Conv2d)


def clean(config: dict) -> dict:
    return {k: v for k, v in config.items() if not k.startswith("_")}


def text_config(config: dict) -> CLIPTextConfig:
    return CLIPTextConfig(**{k: v for k, v in clean(config).items() if k != "architectures"})


@pytest.fixture(scope="module")
def full_size():
    """The real SDXL 1.0 base and inpainting parts, without memory."""
    with torch.device("meta"):
        return {
            "unet": UNet2DConditionModel(**clean(reference.SDXL_UNET)),
            "unet_inpainting": UNet2DConditionModel(**clean(reference.SDXL_INPAINTING_UNET)),
            "vae": AutoencoderKL(**clean(reference.SDXL_VAE)),
            "text_encoder": CLIPTextModel(text_config(reference.CLIP_L_TEXT)),
            "text_encoder_2": CLIPTextModelWithProjection(text_config(reference.OPEN_CLIP_BIGG_TEXT)),
        }


def loaded(parts) -> types.SimpleNamespace:
    """What `kohya_name` reads of a loaded model: its parts."""
    return types.SimpleNamespace(parts=parts)


def original_of(parts, unet_name: str = "unet") -> dict:
    unet, vae = parts[unet_name], parts["vae"]
    return to_original(
        unet.state_dict(),
        unet.config,
        vae.state_dict(),
        vae.config,
        parts["text_encoder"].state_dict(),
        parts["text_encoder_2"].state_dict(),
    )


def test_single_file_layout_is_read_back_by_diffusers_converters(full_size):
    original = original_of(full_size)
    own = sum(len(full_size[p].state_dict()) for p in ("unet", "vae", "text_encoder", "text_encoder_2"))
    position_ids = sum(k.endswith("position_ids") for p in ("text_encoder", "text_encoder_2")
                       for k in full_size[p].state_dict())  # fmt: skip
    te2 = full_size["text_encoder_2"].state_dict()
    fused = 2 * 2 * 32  # q/k/v weights and biases of 32 layers become one in_proj weight and bias each
    assert len(original) == own - position_ids - fused
    assert infer_diffusers_model_type(original) == "xl_base"  # what from_single_file sees: an SDXL base checkpoint

    unet = full_size["unet"]
    state = unet.state_dict()
    unet_original = {k: v for k, v in original.items() if k.startswith("model.diffusion_model.")}
    assert len(unet_original) == len(state)  # one original key per weight, none merged
    back = convert_ldm_unet_checkpoint(to_original(state, unet.config, {}, {}, {}, {}), unet.config)
    assert set(back) == set(state)
    assert all(back[k] is state[k] for k in state)  # each weight lands where it came from

    vae = full_size["vae"]
    vae_state = {k.removeprefix("first_stage_model."): v for k, v in original.items() if k.startswith("first_stage")}
    assert set(convert_ldm_vae_checkpoint(vae_state, vae.config)) == set(vae.state_dict())

    te1 = {k for k in full_size["text_encoder"].state_dict() if not k.endswith("position_ids")}
    assert {k.removeprefix("text_model.") for k in convert_ldm_clip_checkpoint(original)} == te1
    converted = convert_open_clip_checkpoint(full_size["text_encoder_2"], original, prefix=CLIP_G_PREFIX)
    assert set(converted) == {k for k in te2 if not k.endswith("position_ids")}
    assert converted["text_projection.weight"].shape == te2["text_projection.weight"].shape


def test_known_original_names(full_size):
    original = original_of(full_size)
    for key in (
        "model.diffusion_model.label_emb.0.0.weight",
        "model.diffusion_model.input_blocks.4.1.transformer_blocks.1.attn1.to_q.weight",
        "model.diffusion_model.middle_block.1.transformer_blocks.9.ff.net.2.weight",
        "model.diffusion_model.output_blocks.2.2.conv.weight",
        "first_stage_model.decoder.up.3.block.0.conv1.weight",
        "conditioner.embedders.0.transformer.text_model.encoder.layers.11.mlp.fc2.weight",
        "conditioner.embedders.0.transformer.text_model.final_layer_norm.weight",
        "conditioner.embedders.1.model.transformer.resblocks.31.attn.in_proj_weight",
        "conditioner.embedders.1.model.ln_final.weight",
        "conditioner.embedders.1.model.positional_embedding",
    ):
        assert key in original, key
    assert original["conditioner.embedders.1.model.transformer.resblocks.0.attn.in_proj_weight"].shape == (3840, 1280)
    assert original["conditioner.embedders.1.model.text_projection"].shape == (1280, 1280)


def test_inpainting_layout_is_recognised(full_size):
    original = original_of(full_size, "unet_inpainting")
    assert original["model.diffusion_model.input_blocks.0.0.weight"].shape[1] == 9
    assert infer_diffusers_model_type(original) == "xl_inpaint"


@pytest.mark.parametrize(
    ("part", "module", "kohya"),
    [
        ("unet", "down_blocks.1.attentions.0.transformer_blocks.0.attn1.to_q",
         "lora_unet_input_blocks_4_1_transformer_blocks_0_attn1_to_q"),
        ("unet", "down_blocks.2.attentions.1.transformer_blocks.9.ff.net.2",
         "lora_unet_input_blocks_8_1_transformer_blocks_9_ff_net_2"),
        ("unet", "mid_block.attentions.0.proj_in", "lora_unet_middle_block_1_proj_in"),
        ("unet", "up_blocks.0.attentions.2.transformer_blocks.3.attn2.to_k",
         "lora_unet_output_blocks_2_1_transformer_blocks_3_attn2_to_k"),
        ("unet", "up_blocks.2.resnets.1.conv1", "lora_unet_output_blocks_7_0_in_layers_2"),
        ("unet", "down_blocks.0.resnets.0.time_emb_proj", "lora_unet_input_blocks_1_0_emb_layers_1"),
        ("unet", "add_embedding.linear_1", "lora_unet_label_emb_0_0"),
        ("text_encoder", "encoder.layers.0.self_attn.q_proj", "lora_te1_text_model_encoder_layers_0_self_attn_q_proj"),
        ("text_encoder_2", "text_model.encoder.layers.0.self_attn.q_proj",
         "lora_te2_text_model_encoder_layers_0_self_attn_q_proj"),
        ("text_encoder_2", "text_model.encoder.layers.31.mlp.fc2", "lora_te2_text_model_encoder_layers_31_mlp_fc2"),
    ],
)  # fmt: skip
def test_kohya_names(full_size, part, module, kohya):
    assert dict(full_size[part].named_modules())[module] is not None  # a module of the real topology
    assert FAMILY.kohya_name(loaded(full_size), part, module) == kohya


def test_every_kohya_unet_name_maps_back_in_diffusers(full_size):
    """diffusers' kohya reader turns the name of every Linear and Conv2d of the real UNet back into that module."""
    unet = full_size["unet"]
    modules = [n for n, m in unet.named_modules() if isinstance(m, ADAPTABLE)]
    state = {}
    for name in modules:
        kohya = FAMILY.kohya_name(loaded(full_size), "unet", name)
        state.update({f"{kohya}.lora_down.weight": torch.zeros(1), f"{kohya}.lora_up.weight": torch.zeros(1)})
        state[f"{kohya}.alpha"] = torch.tensor(1.0)
    converted, _ = StableDiffusionXLPipeline.lora_state_dict(state, unet_config=unet.config)
    peft = convert_unet_state_dict_to_peft({k.removeprefix("unet."): v for k, v in converted.items()})
    assert {k.rsplit(".lora_", 1)[0] for k in peft} == set(modules)
