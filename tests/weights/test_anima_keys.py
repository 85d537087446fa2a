"""Anima's original key layout: the tiny transformer and adapter written as the released file and read back, from
the original's `net.` layout or ComfyUI's prefix, a checkpoint's rotary buffers left out."""

from __future__ import annotations

import torch

from onetrainer.weights import anima_keys


def _state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_the_original_layout_reads_back_under_either_prefix_without_the_rotary_buffers():
    from diffusers import AnimaTextConditioner, CosmosTransformer3DModel

    transformer = CosmosTransformer3DModel(
        num_attention_heads=2, attention_head_dim=16, num_layers=2, text_embed_dim=32, adaln_lora_dim=8,
        rope_scale=(1.0, 4.0, 4.0), extra_pos_embed_type=None,
    )  # fmt: skip
    adapter = AnimaTextConditioner(32, 32, 32, num_layers=1, num_attention_heads=2, target_vocab_size=10)
    original = anima_keys.to_original(_state(transformer), _state(adapter))
    assert "net.blocks.1.adaln_modulation_mlp.1.weight" in original and "net.llm_adapter.norm.weight" in original
    assert anima_keys.original_module_path("transformer_blocks.3.attn2.to_out.0") == "blocks.3.cross_attn.output_proj"
    assert anima_keys.original_module_path("time_embed.t_embedder.linear_1") == "t_embedder.1.linear_1"

    buffers = {"net.pos_embedder.dim_spatial_range": torch.zeros(1), "net.accum_iteration": torch.zeros(1)}
    comfy = {"model.diffusion_model." + k.removeprefix("net."): v for k, v in original.items()}
    for file in ({**original, **buffers}, comfy):
        dit, llm_adapter = anima_keys.split_original(file)
        assert dit.keys() == transformer.state_dict().keys()
        assert llm_adapter.keys() == adapter.state_dict().keys()
        assert all(torch.equal(dit[k], v) for k, v in transformer.state_dict().items())
    # diffusers' own names pass as they are
    assert anima_keys.split_original(_state(transformer))[0].keys() == transformer.state_dict().keys()
