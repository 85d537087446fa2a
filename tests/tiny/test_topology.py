"""The tiny models have the real models' topology: same state-dict keys and structure, only smaller widths."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
import torch

from onetrainer.config.enums import ModelType
from onetrainer.tiny import TINY_VARIANTS
from onetrainer.tiny import reference as ref
from onetrainer.tiny.components import tiny_config
from onetrainer.tiny.reference import depth_fields, nested_configs, width_fields

RealShapes = Callable[[str, str], dict[str, torch.Size]]
PipelineOf = Callable[[str], Any]
MODEL_COMPONENTS = (
    "unet",
    "transformer",
    "prior",
    "decoder",
    "vae",
    "vqgan",
    "text_encoder",
    "text_encoder_2",
    "image_encoder",
)
CASES = [
    (variant.name, component)
    for variant in TINY_VARIANTS.values()
    for component in MODEL_COMPONENTS
    if component in variant.references
]


def _normalise(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


@pytest.mark.parametrize(("variant", "component"), CASES)
def test_state_dict_keys_equal_the_real_models(
    variant: str, component: str, real_shapes: RealShapes, tiny_pipeline: PipelineOf
) -> None:
    tiny = getattr(tiny_pipeline(variant), component).state_dict()
    real = real_shapes(variant, component)
    assert set(tiny) == set(real)
    # Only widths shrink: every tensor keeps its rank (a conv stays a conv, a linear projection stays linear).
    assert {k: len(v.shape) for k, v in tiny.items()} == {k: len(v) for k, v in real.items()}
    assert sum(v.numel() for v in tiny.values()) < 10_000_000


def _as_in_the_hub_file(config: dict[str, Any], real: dict[str, Any]) -> dict[str, Any]:
    """A transformers 5 config dict with the hub file's layout: a composite model's text fields (Qwen2.5-VL's
    `text_config`) at the top level, `rope_theta` and `rope_scaling` taken back out of `rope_parameters`."""
    if "text_config" in config and "text_config" not in real:
        config = {**config["text_config"], **{k: v for k, v in config.items() if k != "text_config"}}
    rope = config.get("rope_parameters")
    if rope is not None and "rope_theta" in real:
        config = {**config, "rope_theta": rope["rope_theta"]}
    if rope is not None and isinstance(real.get("rope_scaling"), dict):
        config = {**config, "rope_scaling": {k: rope.get(k) for k in real["rope_scaling"]}}
    return config


def _assert_width_fields_only(kind: str, config: dict[str, Any], real: dict[str, Any], depth: dict[str, Any]) -> None:
    assert set(depth) <= depth_fields(kind)
    assert all(config[k] == v for k, v in depth.items() if k not in nested_configs())
    allowed = width_fields(kind) | set(depth)
    differing = {k for k, v in real.items() if _normalise(config.get(k)) != _normalise(v)}
    bookkeeping = {k for k in real if k.startswith("_")} | {"architectures"}
    # T5EncoderModel (and UMT5's) rewrites these two in its own config (it is the encoder half, its embeddings tied).
    t5_encoders = {"T5EncoderModel", "UMT5EncoderModel"}
    bookkeeping |= (
        {"is_encoder_decoder", "tie_word_embeddings"} if t5_encoders & set(real.get("architectures", ())) else set()
    )
    # transformers forgets the window size of a model that does not use its sliding window (Qwen2.5-VL).
    bookkeeping |= {"sliding_window"} if real.get("use_sliding_window") is False else set()
    assert differing - bookkeeping <= allowed
    for key in nested_configs() & set(real):  # Qwen2.5-VL's vision tower, Mistral3's: only their own widths differ
        _assert_width_fields_only(key, _as_in_the_hub_file(config[key], real[key]), real[key], depth.get(key, {}))


@pytest.mark.parametrize(("variant", "component"), CASES)
def test_configs_differ_from_the_real_ones_in_width_fields_only(
    variant: str, component: str, tiny_pipeline: PipelineOf
) -> None:
    config = getattr(tiny_pipeline(variant), component).config
    config = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    real = TINY_VARIANTS[variant].references[component]
    kind = component.removesuffix("_2")
    depth = TINY_VARIANTS[variant].depths.get(component, {})
    _assert_width_fields_only(kind, _as_in_the_hub_file(config, real), real, depth)


SHALLOWER = [(v.name, c) for v in TINY_VARIANTS.values() for c in v.depths]


@pytest.mark.parametrize(("variant", "component"), SHALLOWER)
def test_a_shallower_model_has_every_key_pattern_of_the_full_depth(
    variant: str, component: str, full_depth_shapes: RealShapes, tiny_pipeline: PipelineOf
) -> None:
    def patterns(keys) -> set[str]:
        return {re.sub(r"\.\d+\.", ".N.", k) for k in keys}

    tiny = getattr(tiny_pipeline(variant), component).state_dict()
    full = full_depth_shapes(variant, component)
    assert patterns(tiny) == patterns(full)
    assert len(tiny) < len(full)


def test_real_key_counts_match_the_published_checkpoints(real_shapes: RealShapes) -> None:
    # Guards the reference configs themselves: these are the key counts of the real diffusers checkpoints.
    assert len(real_shapes("sd15", "unet")) == 686
    assert len(real_shapes("sd21", "unet")) == 686
    assert len(real_shapes("sdxl", "unet")) == 1680
    assert len(real_shapes("sd15", "vae")) == 248
    assert len(real_shapes("sd15", "text_encoder")) == 196
    assert len(real_shapes("sd21", "text_encoder")) == 372
    assert len(real_shapes("sdxl", "text_encoder_2")) == 517


def test_landmark_keys(tiny_pipeline: PipelineOf) -> None:
    sd15 = tiny_pipeline("sd15").unet.state_dict()
    sd21 = tiny_pipeline("sd21").unet.state_dict()
    sdxl = tiny_pipeline("sdxl").unet.state_dict()
    # SD 1.x projects into its transformers with 1x1 convs, SD 2.x and SDXL with linear layers.
    assert sd15["down_blocks.0.attentions.0.proj_in.weight"].dim() == 4
    assert sd21["down_blocks.0.attentions.0.proj_in.weight"].dim() == 2
    assert "down_blocks.3.attentions.0.proj_in.weight" not in sd15
    # SDXL: no attention in the first block, 10 transformer layers deep in the last and in the middle.
    assert "down_blocks.0.attentions.0.proj_in.weight" not in sdxl
    assert "down_blocks.2.attentions.1.transformer_blocks.9.attn2.to_k.weight" in sdxl
    assert "mid_block.attentions.0.transformer_blocks.9.ff.net.2.weight" in sdxl
    assert "up_blocks.0.attentions.2.transformer_blocks.9.attn1.to_out.0.weight" in sdxl
    assert "add_embedding.linear_1.weight" in sdxl
    assert "down_blocks.2.resnets.0.conv_shortcut.weight" in sdxl


CLIP_VARIANTS = [
    name for name, v in TINY_VARIANTS.items() if v.references["tokenizer"]["tokenizer_class"] == "CLIPTokenizer"
]


@pytest.mark.parametrize("variant", CLIP_VARIANTS)
def test_clip_text_encoders_match_their_tokenizers(variant: str, tiny_pipeline: PipelineOf) -> None:
    pipeline = tiny_pipeline(variant)
    for suffix in ("", "_2"):
        encoder = getattr(pipeline, f"text_encoder{suffix}", None)
        references = TINY_VARIANTS[variant].references
        if encoder is None or references[f"tokenizer{suffix}"]["tokenizer_class"] != "CLIPTokenizer":
            continue  # none, or Flux's T5
        tokenizer = getattr(pipeline, f"tokenizer{suffix}")
        real = TINY_VARIANTS[variant].references[f"text_encoder{suffix}"]
        assert encoder.config.vocab_size == len(tokenizer)
        assert tokenizer.model_max_length == 77
        assert encoder.config.max_position_embeddings == real["max_position_embeddings"]  # Long-CLIP's: 248
        depth = TINY_VARIANTS[variant].depths.get(f"text_encoder{suffix}", {})
        assert encoder.config.num_hidden_layers == depth.get("num_hidden_layers", real["num_hidden_layers"])
        assert encoder.config.hidden_act == real["hidden_act"]
        assert encoder.config.eos_token_id == tokenizer.eos_token_id
        assert tokenizer.pad_token == TINY_VARIANTS[variant].references[f"tokenizer{suffix}"]["pad_token"]


def test_family_details(tiny_pipeline: PipelineOf) -> None:
    sd15 = tiny_pipeline("sd15")
    assert sd15.text_encoder.config.hidden_act == "quick_gelu"
    assert sd15.tokenizer.pad_token == "<|endoftext|>"
    assert sd15.vae.config.scaling_factor == 0.18215
    sd21 = tiny_pipeline("sd21")
    assert sd21.text_encoder.config.num_hidden_layers == 23
    assert sd21.tokenizer.pad_token == "!"
    assert sd21.unet.config.use_linear_projection
    assert sd21.unet.config.upcast_attention
    assert sd21.unet.config.cross_attention_dim == sd21.text_encoder.config.hidden_size
    sdxl = tiny_pipeline("sdxl")
    widths = (sdxl.text_encoder.config.hidden_size, sdxl.text_encoder_2.config.hidden_size)
    assert widths[0] != widths[1]
    assert sdxl.unet.config.cross_attention_dim == sum(widths)
    assert list(sdxl.unet.config.transformer_layers_per_block) == [1, 2, 10]
    assert sdxl.unet.config.addition_time_embed_dim == 256
    assert sdxl.unet.config.projection_class_embeddings_input_dim == 6 * 256 + sdxl.text_encoder_2.config.projection_dim
    assert sdxl.vae.config.scaling_factor == 0.13025
    assert tiny_pipeline("sdxl-inpainting").unet.config.in_channels == 9
    for variant in ("sd15-inpainting", "sd20-inpainting"):
        assert tiny_pipeline(variant).unet.config.in_channels == 9


@pytest.mark.parametrize("variant", TINY_VARIANTS)
def test_schedulers(variant: str, tiny_pipeline: PipelineOf) -> None:
    spec = TINY_VARIANTS[variant]
    scheduler = tiny_pipeline(variant).scheduler
    assert type(scheduler).__name__ == spec.references["scheduler"]["_class_name"]
    assert scheduler.config.get("prediction_type", "epsilon") == spec.prediction_type
    for key, value in spec.references["scheduler"].items():
        if not key.startswith("_"):
            assert scheduler.config[key] == value, key
    # Sana's DPM-Solver++ and HiDream-I1-Full's and Wan's UniPC run on flow sigmas, the model predicting the flow; the
    # other flow models' Euler schedulers have no prediction setting
    flows = {
        "sana": "flow_prediction",
        "hidream": "flow_prediction",
        "wan21": "flow_prediction",
        "wan22": "flow_prediction",
        "wan21-i2v": "flow_prediction",
    }
    expected = {"sd20": "v_prediction", "sd21": "v_prediction", **flows}.get(variant, "epsilon")
    assert spec.prediction_type == expected


def test_variants_describe_themselves(tiny_pipeline: PipelineOf) -> None:
    for name, variant in TINY_VARIANTS.items():
        assert variant.name == name
        assert isinstance(variant.model_type, ModelType)
        assert variant.description
        assert variant.resolution == (128 if variant.module.endswith((".wuerstchen", ".cascade")) else 64)
        assert type(tiny_pipeline(name)).__name__ == variant.pipeline_class


def test_pixart_details(tiny_pipeline: PipelineOf) -> None:
    pipeline = tiny_pipeline("pixart")
    assert pipeline.text_encoder.config.vocab_size == len(pipeline.tokenizer)
    assert pipeline.text_encoder.config.num_layers == 24
    assert pipeline.text_encoder.config.is_gated_act
    assert pipeline.transformer.config.caption_channels == pipeline.text_encoder.config.d_model
    assert pipeline.transformer.config.num_layers == 28
    assert pipeline.transformer.use_additional_conditions
    assert "adaln_single.emb.resolution_embedder.linear_1.weight" in pipeline.transformer.state_dict()
    assert pipeline.tokenizer("a red circle").input_ids[-1] == pipeline.tokenizer.eos_token_id == 1
    assert pipeline.tokenizer.pad_token_id == 0


def test_tiny_config_refuses_topology_changes() -> None:
    with pytest.raises(ValueError, match="layers_per_block"):
        tiny_config("unet", ref.SD15_UNET, layers_per_block=1)
    # A nested config's fields are checked against its own kind's.
    with pytest.raises(ValueError, match="patch_size"):
        tiny_config("text_encoder", ref.QWEN25_VL_7B_TEXT, vision_config={"patch_size": 7})
    with pytest.raises(ValueError, match="window_size"):
        tiny_config("text_encoder", ref.QWEN25_VL_7B_TEXT, depth={"vision_config": {"window_size": 56}})
    shallow = tiny_config("text_encoder", ref.QWEN25_VL_7B_TEXT, depth={"vision_config": {"depth": 2}})
    assert shallow["vision_config"] == {**ref.QWEN25_VL_7B_TEXT["vision_config"], "depth": 2}


def test_flux_and_chroma_details(tiny_pipeline: PipelineOf) -> None:
    dev, schnell, fill, chroma = (tiny_pipeline(v) for v in ("flux-dev", "flux-schnell", "flux-fill", "chroma"))
    assert dev.transformer.config.guidance_embeds and not schnell.transformer.config.guidance_embeds
    assert "time_text_embed.guidance_embedder.linear_1.weight" in dev.transformer.state_dict()
    assert "time_text_embed.guidance_embedder.linear_1.weight" not in schnell.transformer.state_dict()
    # the pooled CLIP-L output and T5's hidden states feed the transformer at their tiny widths
    assert dev.transformer.config.pooled_projection_dim == dev.text_encoder.config.hidden_size
    assert dev.transformer.config.joint_attention_dim == dev.text_encoder_2.config.d_model
    assert chroma.transformer.config.joint_attention_dim == chroma.text_encoder.config.d_model
    assert sum(dev.transformer.config.axes_dims_rope) == dev.transformer.config.attention_head_dim
    # Fill: noisy latents, masked image latents and the 8x8 mask, each packed 2x2
    assert fill.transformer.config.in_channels == (16 + 16 + 64) * 4 and fill.transformer.config.out_channels == 64
    assert "distilled_guidance_layer.layers.4.linear_1.weight" in chroma.transformer.state_dict()
    for pipeline in (dev, schnell, fill, chroma):
        assert pipeline.vae.config.latent_channels == 16
        assert (pipeline.vae.config.scaling_factor, pipeline.vae.config.shift_factor) == (0.3611, 0.1159)
        assert len(pipeline.transformer.transformer_blocks) == len(pipeline.transformer.single_transformer_blocks) == 2
    assert dev.text_encoder_2.config.num_layers == 24 and chroma.text_encoder.config.num_layers == 24
    assert dev.scheduler.config.use_dynamic_shifting and not schnell.scheduler.config.use_dynamic_shifting
