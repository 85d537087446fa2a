"""Flux.1 (dev, schnell, Fill) and Chroma: the original (BFL) checkpoint layout ↔ diffusers, on the full-size names
(meta device, diffusers' own converters as they are) and on tiny models of the real topology (diffusers' converters
at the tiny width, `flux_models.at_width`)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from onetrainer.weights import flux_keys
from tests.weights import flux_models as fm

VARIANTS = list(fm.RELEASED)


def _linear(path: str) -> list[str]:
    return [f"{path}.weight", f"{path}.bias"]


def _expected_original_keys(config: dict) -> set[str]:
    """The keys of BFL's `flux1-dev/schnell/fill-dev.safetensors` and of Chroma's single files, written out from
    their model code (`flux/model.py`: MLPEmbedder in_layer/out_layer, DoubleStreamBlock, SingleStreamBlock, LastLayer;
    Chroma's Approximator), not from the map under test."""
    chroma = config["_class_name"] == "ChromaTransformer2DModel"
    names = _linear("img_in") + _linear("txt_in") + _linear("final_layer.linear")
    if chroma:
        names += _linear("distilled_guidance_layer.in_proj") + _linear("distilled_guidance_layer.out_proj")
        for n in range(config["approximator_layers"]):
            names += _linear(f"distilled_guidance_layer.layers.{n}.in_layer")
            names += _linear(f"distilled_guidance_layer.layers.{n}.out_layer")
            names.append(f"distilled_guidance_layer.norms.{n}.scale")
    else:
        embedders = ["time_in", "vector_in"] + (["guidance_in"] if config["guidance_embeds"] else [])
        for embedder in embedders:
            names += _linear(f"{embedder}.in_layer") + _linear(f"{embedder}.out_layer")
        names += _linear("final_layer.adaLN_modulation.1")
    for n in range(config["num_layers"]):
        for stream in ("img", "txt"):
            block = f"double_blocks.{n}.{stream}"
            names += _linear(f"{block}_attn.qkv") + _linear(f"{block}_attn.proj")
            names += [f"{block}_attn.norm.query_norm.scale", f"{block}_attn.norm.key_norm.scale"]
            names += _linear(f"{block}_mlp.0") + _linear(f"{block}_mlp.2")
            if not chroma:
                names += _linear(f"{block}_mod.lin")
    for n in range(config["num_single_layers"]):
        block = f"single_blocks.{n}"
        names += _linear(f"{block}.linear1") + _linear(f"{block}.linear2")
        names += [f"{block}.norm.query_norm.scale", f"{block}.norm.key_norm.scale"]
        if not chroma:
            names += _linear(f"{block}.modulation.lin")
    return set(names)


@pytest.mark.parametrize("variant", VARIANTS)
def test_full_size_names_are_the_released_checkpoints_and_diffusers_converts_them_back(variant: str) -> None:
    real = fm.RELEASED[variant]
    model = fm.meta_model(real)
    state = model.state_dict()
    assert set(state) == flux_keys.diffusers_keys(real)
    assert flux_keys.original_keys(real) == _expected_original_keys(real)

    original = flux_keys.diffusers_to_original(state, real)
    assert set(original) == _expected_original_keys(real)
    linear1 = original["single_blocks.37.linear1.weight"]
    assert linear1.shape == (3 * 3072 + 12288, 3072)  # q|k|v|mlp, the sizes diffusers' converter splits by

    # diffusers' own converter, at the width it was written for: every key consumed, every diffusers key back.
    checkpoint = dict(original)
    converted = fm.single_file_converter(real)(checkpoint)
    assert checkpoint == {}
    assert set(converted) == set(state)
    for key, value in state.items():
        assert converted[key].shape == value.shape, key

    topology = flux_keys.original_topology(original)
    assert {**real, **topology} == real  # a released file determines its own config, but for the rotary axes


@pytest.fixture(scope="module", params=VARIANTS)
def tiny(request) -> tuple[dict, torch.nn.Module]:
    config = fm.tiny(fm.RELEASED[request.param])
    return config, fm.build(config, seed=3)


def test_round_trip_is_identical_and_diffusers_converter_agrees(tiny) -> None:
    config, model = tiny
    state = model.state_dict()
    original = flux_keys.diffusers_to_original(state, config)
    assert set(original) == _expected_original_keys(config)
    # The model's own config (no `_class_name`: Chroma is told by its approximator fields) maps the same.
    assert flux_keys.module_map(dict(model.config)) == flux_keys.module_map(config)

    back = flux_keys.original_to_diffusers(original, config)
    assert set(back) == set(state)
    for key, value in state.items():
        assert torch.equal(back[key], value), key
    fresh = type(model)(**{k: v for k, v in config.items() if not k.startswith("_")})
    fresh.load_state_dict(back, strict=True)

    # What diffusers' converter (at this width) makes of our file is the model's own state dict.
    checkpoint = dict(original)
    theirs = fm.single_file_converter(config)(checkpoint)
    assert checkpoint == {} and set(theirs) == set(state)
    for key, value in state.items():
        assert torch.equal(theirs[key], value), key


def test_fused_rows_and_the_final_modulation_follow_the_original_code(tiny) -> None:
    config, model = tiny
    original = flux_keys.diffusers_to_original(model.state_dict(), config)
    x = torch.randn(5, fm.WIDTH)
    with torch.no_grad():
        single = model.single_transformer_blocks[37]
        out = x @ original["single_blocks.37.linear1.weight"].T + original["single_blocks.37.linear1.bias"]
        q, k, v, mlp = out.split([fm.WIDTH, fm.WIDTH, fm.WIDTH, 4 * fm.WIDTH], dim=-1)  # SingleStreamBlock's split
        assert torch.allclose(q, single.attn.to_q(x)) and torch.allclose(k, single.attn.to_k(x))
        assert torch.allclose(v, single.attn.to_v(x)) and torch.allclose(mlp, single.proj_mlp(x))

        double = model.transformer_blocks[18]
        txt = x @ original["double_blocks.18.txt_attn.qkv.weight"].T + original["double_blocks.18.txt_attn.qkv.bias"]
        tq, tk, tv = txt.chunk(3, dim=-1)
        assert torch.allclose(tq, double.attn.add_q_proj(x)) and torch.allclose(tk, double.attn.add_k_proj(x))
        assert torch.allclose(tv, double.attn.add_v_proj(x))
        assert torch.equal(original["double_blocks.18.txt_attn.norm.key_norm.scale"], double.attn.norm_added_k.weight)

        if "norm_out.linear.weight" in model.state_dict():
            # LastLayer: shift, scale = adaLN_modulation(c).chunk(2); diffusers' AdaLayerNormContinuous: scale, shift.
            modulation = x @ original["final_layer.adaLN_modulation.1.weight"].T
            modulation = modulation + original["final_layer.adaLN_modulation.1.bias"]
            shift, scale = modulation.chunk(2, dim=-1)
            d_scale, d_shift = model.norm_out.linear(x).chunk(2, dim=-1)
            assert torch.allclose(shift, d_shift) and torch.allclose(scale, d_scale)


def test_a_model_built_from_the_files_topology_computes_the_same(tiny) -> None:
    config, model = tiny
    original = flux_keys.diffusers_to_original(model.state_dict(), config)
    comfy = {f"model.diffusion_model.{k}": v for k, v in original.items()}  # ComfyUI's full-checkpoint prefix
    comfy["first_stage_model.decoder.conv_in.weight"] = torch.zeros(1)  # a bundled VAE is not the transformer's
    reference = fm.FLUX_DEV if config["_class_name"] == "FluxTransformer2DModel" else fm.CHROMA
    rebuilt_config = {**reference, **flux_keys.original_topology(comfy), "axes_dims_rope": config["axes_dims_rope"]}
    assert rebuilt_config == config

    rebuilt = fm.build(rebuilt_config, seed=99)
    rebuilt.load_state_dict(flux_keys.original_to_diffusers(comfy, rebuilt_config), strict=True)
    with torch.no_grad():
        assert torch.equal(rebuilt(**fm.inputs(config))[0], model(**fm.inputs(config))[0])


def test_leftovers_gaps_and_widths_are_named(tiny) -> None:
    config, model = tiny
    state = dict(model.state_dict())
    original = flux_keys.diffusers_to_original(state, config)

    broken = {**original, "double_blocks.19.img_attn.qkv.weight": torch.zeros(1)}
    del broken["single_blocks.3.linear2.bias"]
    with pytest.raises(ValueError, match=r"missing single_blocks\.3\.linear2\.bias; unexpected double_blocks\.19"):
        flux_keys.original_to_diffusers(broken, config)

    wider = {**config, "num_attention_heads": fm.HEADS + 1}
    with pytest.raises(
        ValueError, match=r"double_blocks\.0\.img_attn\.qkv\.weight has 72 rows, not the 96 .* width 32"
    ):
        flux_keys.original_to_diffusers(original, wider)

    del state["single_transformer_blocks.0.proj_mlp.weight"]
    with pytest.raises(ValueError, match=r"missing single_transformer_blocks\.0\.proj_mlp\.weight"):
        flux_keys.diffusers_to_original(state, config)


def test_schnell_and_dev_differ_by_the_guidance_embedder() -> None:
    dev, schnell = fm.tiny(fm.FLUX_DEV), fm.tiny(fm.FLUX_SCHNELL)
    extra = flux_keys.original_keys(dev) - flux_keys.original_keys(schnell)
    assert extra == {f"guidance_in.{layer}.{p}" for layer in ("in_layer", "out_layer") for p in ("weight", "bias")}
    model = fm.build(schnell)
    topology = flux_keys.original_topology(flux_keys.diffusers_to_original(model.state_dict(), schnell))
    assert topology["guidance_embeds"] is False and topology["out_channels"] is None


def test_reads_original_files_and_refuses_the_other_model(tmp_path: Path) -> None:
    config = fm.tiny(fm.FLUX_FILL)
    model = fm.build(config, seed=5)
    original = flux_keys.diffusers_to_original(model.state_dict(), config)
    path = tmp_path / "flux1-fill-dev.safetensors"
    save_file({k: v.contiguous() for k, v in original.items()}, path)

    # The dev reference with a Fill file: the file's channels win (the family compares in_channels).
    reference = {**fm.tiny(fm.FLUX_DEV)}
    state, read_config = flux_keys.read_original_checkpoint(path, reference)
    assert read_config["in_channels"] == 384 and read_config["out_channels"] == 64
    for key, value in model.state_dict().items():
        assert torch.equal(state[key], value), key

    with pytest.raises(ValueError, match=r"flux1-fill-dev\.safetensors: a Flux\.1 checkpoint, not a Chroma one"):
        flux_keys.read_original_checkpoint(path, fm.tiny(fm.CHROMA))
    other = tmp_path / "not-flux.safetensors"
    save_file({"blocks.0.attn.qkv.weight": torch.zeros(1)}, other)
    with pytest.raises(ValueError, match=r"not-flux\.safetensors: not a Flux/Chroma checkpoint"):
        flux_keys.read_original_checkpoint(other, reference)
