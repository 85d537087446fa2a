"""Flux.2's transformer between diffusers' names and Black Forest Labs' layout: our map and diffusers' own converter
(what `from_single_file` reads BFL's files with) agree both ways, on klein's topology and on [dev]'s (the guidance
embedding), with ComfyUI's prefix too; a half-fused projection or a key of neither layout is refused by name."""

from __future__ import annotations

import pytest
import torch

from onetrainer.weights import flux2_keys


def _state(guidance: bool) -> dict[str, torch.Tensor]:
    from diffusers import Flux2Transformer2DModel

    torch.manual_seed(0)
    model = Flux2Transformer2DModel(
        num_layers=2, num_single_layers=2, attention_head_dim=16, num_attention_heads=2, joint_attention_dim=24,
        axes_dims_rope=(4, 4, 4, 4), guidance_embeds=guidance, in_channels=8,
    )  # fmt: skip
    return {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("guidance", [False, True], ids=["klein", "dev"])
def test_the_map_and_diffusers_converter_agree_both_ways(guidance):
    from diffusers.loaders.single_file_utils import convert_flux2_transformer_checkpoint_to_diffusers

    state = _state(guidance)
    original = flux2_keys.to_original(state)
    assert ("guidance_in.in_layer.weight" in original) is guidance
    assert (
        original["double_blocks.1.img_attn.qkv.weight"].shape[0]
        == 3 * state["transformer_blocks.1.attn.to_q.weight"].shape[0]
    )
    converted = convert_flux2_transformer_checkpoint_to_diffusers(dict(original))
    assert converted.keys() == state.keys() and all(torch.equal(converted[k], state[k]) for k in state)
    for prefix in ("", "model.diffusion_model.", "diffusion_model."):
        ours = flux2_keys.to_diffusers({prefix + k: v for k, v in original.items()})
        assert ours.keys() == state.keys() and all(torch.equal(ours[k], state[k]) for k in state)
    assert flux2_keys.to_diffusers(state).keys() == state.keys()  # diffusers' names pass as they are
    # the output modulation's halves swap: (scale, shift) in diffusers, (shift, scale) in BFL's layout
    scale, shift = state["norm_out.linear.weight"].chunk(2)
    assert torch.equal(original["final_layer.adaLN_modulation.1.weight"], torch.cat([shift, scale]))
    assert (
        flux2_keys.module_to_original("single_transformer_blocks.0.attn.to_qkv_mlp_proj") == "single_blocks.0.linear1"
    )
    assert flux2_keys.module_to_original("transformer_blocks.0.attn.to_q") is None  # a slice of img_attn.qkv


def test_a_half_fused_projection_or_a_foreign_key_is_refused():
    state = _state(False)
    del state["transformer_blocks.0.attn.to_k.weight"]
    with pytest.raises(ValueError, match=r"img_attn\.qkv\.weight: only attn\.to_q, attn\.to_v"):
        flux2_keys.to_original(state)
    with pytest.raises(ValueError, match="no name in Black Forest Labs"):
        flux2_keys.to_original({"lora.weight": torch.zeros(1)})
    with pytest.raises(ValueError, match="not a weight of Black Forest Labs"):
        flux2_keys.to_diffusers(
            {"img_in.weight": torch.zeros(1), "double_blocks.0.img_attn.nope.weight": torch.zeros(1)}
        )
