"""PixArt kohya LoRA (`pixart_lora.LAYOUT`, the fused layout Flux and SD 3 share): split q/k/v (k/v) adapters ↔ one
exact block-diagonal LoRA on the fused native layer."""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig, get_peft_model_state_dict, inject_adapter_in_model

from onetrainer.tiny import components
from onetrainer.tiny import reference as ref
from onetrainer.tiny.pixart import TRANSFORMER_HEADS
from onetrainer.weights import lycoris_keys, pixart_keys, pixart_lora
from onetrainer.weights.adapter_kinds import LOHA, LORA
from onetrainer.weights.fused_transformer_lora import unet_name

WIDTH = TRANSFORMER_HEADS * components.HEAD_WIDTH
CONFIG = components.tiny_config(
    "transformer",
    ref.PIXART_ALPHA_TRANSFORMER,
    num_attention_heads=TRANSFORMER_HEADS,
    attention_head_dim=components.HEAD_WIDTH,
    cross_attention_dim=WIDTH,
    caption_channels=32,
)
SELF = "transformer_blocks.5.attn1"
LAYOUT = pixart_lora.LAYOUT
CROSS = "transformer_blocks.5.attn2"


def to_kohya(state: dict, alphas) -> dict:
    return LAYOUT.to_kohya(LORA, state, alphas, None, CONFIG)


def from_kohya(state: dict) -> tuple[dict, dict, dict, list]:
    read = LAYOUT.from_kohya(LORA, state, CONFIG)
    return read.weights, read.alphas, read.ranks, read.unknown


def _adapter(module: str, rank: int, generator: torch.Generator, inputs: int = WIDTH, outputs: int = WIDTH) -> dict:
    return {
        f"{module}.lora_A.weight": torch.randn(rank, inputs, generator=generator),
        f"{module}.lora_B.weight": torch.randn(outputs, rank, generator=generator),
    }


def _delta(down: torch.Tensor, up: torch.Tensor, alpha: float) -> torch.Tensor:
    """What a consumer adds to the weight: (alpha / rank) · up · down (a conv's kernels flattened)."""
    return (alpha / down.shape[0]) * up.flatten(1) @ down.flatten(1)


def _kohya_delta(state: dict, name: str) -> torch.Tensor:
    return _delta(state[f"{name}.lora_down.weight"], state[f"{name}.lora_up.weight"], float(state[f"{name}.alpha"]))


def _peft_delta(state: dict, module: str, alpha: float) -> torch.Tensor:
    return _delta(state[f"{module}.lora_A.weight"], state[f"{module}.lora_B.weight"], alpha)


@pytest.mark.parametrize(
    ("ranks", "alphas"),
    [((4, 4, 4), (8.0, 8.0, 8.0)), ((2, 4, 3), (1.0, 8.0, 3.0)), ((4, 4, 4), (4.0, 2.0, 4.0))],
    ids=["equal", "mixed-ranks-and-alphas", "mixed-alphas"],
)
def test_split_qkv_exports_exactly_as_one_fused_lora(ranks: tuple, alphas: tuple) -> None:
    generator = torch.Generator().manual_seed(0)
    modules = [f"{SELF}.to_q", f"{SELF}.to_k", f"{SELF}.to_v"]
    state: dict = {}
    for module, rank in zip(modules, ranks):
        state |= _adapter(module, rank, generator)
    module_alphas = dict(zip(modules, alphas))

    kohya = to_kohya(state, module_alphas)

    name = "lora_unet_blocks_5_attn_qkv"
    assert set(kohya) == {f"{name}.lora_down.weight", f"{name}.lora_up.weight", f"{name}.alpha"}
    assert kohya[f"{name}.lora_down.weight"].shape == (sum(ranks), WIDTH)
    assert kohya[f"{name}.lora_up.weight"].shape == (3 * WIDTH, sum(ranks))
    expected = torch.cat([_peft_delta(state, m, a) for m, a in zip(modules, alphas)], dim=0)
    assert torch.allclose(_kohya_delta(kohya, name), expected, atol=1e-5)
    if len(set(ranks)) == 1 and len(set(alphas)) == 1:
        assert float(kohya[f"{name}.alpha"]) == 3 * alphas[0]  # rank 3r, alpha ×3: the weights are untouched
        assert torch.equal(kohya[f"{name}.lora_up.weight"][WIDTH : 2 * WIDTH, 4:8], state[f"{SELF}.to_k.lora_B.weight"])

    # And back: per-projection adapters with the same ΔW each.
    weights, back_alphas, back_ranks, unknown = from_kohya(kohya)
    assert unknown == [] and set(back_ranks) == set(modules)
    for module, alpha in zip(modules, alphas):
        assert torch.allclose(_peft_delta(weights, module, back_alphas[module]), _peft_delta(state, module, alpha))
    if len(set(ranks)) == 1 and len(set(alphas)) == 1:
        assert back_alphas == module_alphas and back_ranks == dict(zip(modules, ranks))
        for key, value in state.items():
            assert torch.equal(weights[key], value), key


def test_cross_attention_kv_fuses_two_adapters_and_q_and_proj_stay_single() -> None:
    generator = torch.Generator().manual_seed(1)
    state = (
        _adapter(f"{CROSS}.to_k", 4, generator)
        | _adapter(f"{CROSS}.to_v", 4, generator)
        | _adapter(f"{CROSS}.to_q", 4, generator)
        | _adapter(f"{CROSS}.to_out.0", 4, generator)
        | _adapter("transformer_blocks.5.ff.net.0.proj", 4, generator, outputs=4 * WIDTH)
    )
    kohya = to_kohya(state, 6.0)

    kv = "lora_unet_blocks_5_cross_attn_kv_linear"
    assert kohya[f"{kv}.lora_down.weight"].shape == (8, WIDTH)
    assert float(kohya[f"{kv}.alpha"]) == 12.0
    expected = torch.cat([_peft_delta(state, f"{CROSS}.to_k", 6.0), _peft_delta(state, f"{CROSS}.to_v", 6.0)])
    assert torch.allclose(_kohya_delta(kohya, kv), expected, atol=1e-5)
    for name, module in [
        ("lora_unet_blocks_5_cross_attn_q_linear", f"{CROSS}.to_q"),
        ("lora_unet_blocks_5_cross_attn_proj", f"{CROSS}.to_out.0"),
        ("lora_unet_blocks_5_mlp_fc1", "transformer_blocks.5.ff.net.0.proj"),
    ]:
        assert torch.equal(kohya[f"{name}.lora_down.weight"], state[f"{module}.lora_A.weight"])
        assert float(kohya[f"{name}.alpha"]) == 6.0


def test_a_fused_layer_with_only_some_projections_adapted() -> None:
    generator = torch.Generator().manual_seed(2)
    state = _adapter(f"{SELF}.to_q", 4, generator) | _adapter(f"{SELF}.to_v", 4, generator)
    kohya = to_kohya(state, 4.0)
    delta = _kohya_delta(kohya, "lora_unet_blocks_5_attn_qkv")
    assert not delta[WIDTH : 2 * WIDTH].any()  # k is unchanged
    assert torch.allclose(delta[2 * WIDTH :], _peft_delta(state, f"{SELF}.to_v", 4.0), atol=1e-5)

    weights, alphas, ranks, _ = from_kohya(kohya)
    assert set(ranks) == {f"{SELF}.to_q", f"{SELF}.to_v"}
    assert torch.allclose(_peft_delta(weights, f"{SELF}.to_v", alphas[f"{SELF}.to_v"]), delta[2 * WIDTH :])


def test_a_lora_trained_on_the_fused_layer_cannot_be_split() -> None:
    generator = torch.Generator().manual_seed(3)
    name = "lora_unet_blocks_5_attn_qkv"
    mixed = {
        f"{name}.lora_down.weight": torch.randn(6, WIDTH, generator=generator),
        f"{name}.lora_up.weight": torch.randn(3 * WIDTH, 6, generator=generator),
        f"{name}.alpha": torch.tensor(6.0),
    }
    with pytest.raises(ValueError, match=r"lora_unet_blocks_5_attn_qkv: .*not block-diagonal"):
        from_kohya(mixed)


def test_unknown_names_are_reported() -> None:
    stray = {"lora_unet_blocks_99_attn_qkv.lora_down.weight": torch.zeros(1, 1)}
    assert from_kohya(stray)[3] == ["lora_unet_blocks_99_attn_qkv"]


def test_a_peft_lora_on_the_whole_transformer_matches_its_merge_in_native_keys() -> None:
    """The kohya file applied to the native weights the way consumers do = the peft-merged model, converted."""
    model = components.build(CONFIG, seed=4, component="transformer")
    base = pixart_keys.diffusers_to_native({k: v.clone() for k, v in model.state_dict().items()}, CONFIG)
    targets = ["to_q", "to_k", "to_v", "to_out.0", "proj", "net.2", "linear_1", "linear_2", "linear", "proj_out"]
    # init_lora_weights=False: random up matrices, so every adapter changes its layer.
    lora_config = LoraConfig(r=4, lora_alpha=2, target_modules=targets, init_lora_weights=False)
    inject_adapter_in_model(lora_config, model)
    kohya = to_kohya(get_peft_model_state_dict(model), 2.0)

    for module in model.modules():
        if hasattr(module, "merge"):
            module.merge()
    merged = pixart_keys.diffusers_to_native(
        {k.replace(".base_layer", ""): v for k, v in model.state_dict().items() if "lora_" not in k}, CONFIG
    )
    names = {key.partition(".")[0] for key in kohya}
    assert "lora_unet_blocks_27_attn_qkv" in names and "lora_unet_csize_embedder_mlp_0" in names
    for native_key, weight in base.items():
        name = unet_name(native_key.rpartition(".")[0])
        expected = weight
        if native_key.endswith(".weight") and name in names:
            expected = weight + _kohya_delta(kohya, name).reshape(weight.shape)
        assert torch.allclose(merged[native_key], expected, atol=1e-5), native_key


def test_t5_names() -> None:
    generator = torch.Generator().manual_seed(5)
    module = "encoder.block.0.layer.0.SelfAttention.q"
    state = _adapter(module, 2, generator)
    name_of = pixart_lora.text_encoder_kohya_name
    kohya = lycoris_keys.to_kohya(LORA, state, name_of, {module: 3.0}, {module: 2})
    assert set(kohya) == {
        "lora_te1_encoder_block_0_layer_0_SelfAttention_q.lora_down.weight",
        "lora_te1_encoder_block_0_layer_0_SelfAttention_q.lora_up.weight",
        "lora_te1_encoder_block_0_layer_0_SelfAttention_q.alpha",
    }
    module_of = {name_of(path): path for path in (module, "encoder.block.0.layer.0")}
    weights, alphas, _, _, unknown = lycoris_keys.from_kohya(LORA, kohya, module_of)
    assert unknown == [] and alphas == {module: 3.0}
    assert all(torch.equal(weights[k], v) for k, v in state.items())


def test_per_projection_names_of_lycoris_kinds_and_of_older_files() -> None:
    """Kinds without an exact fused form keep one entry per projection under `lora_unet_<diffusers path>` (PixArt's
    names since its first files); whole modules keep their native names. A LoRA file with such names reads too."""
    assert LAYOUT.kohya_name(f"{SELF}.to_q", CONFIG) == "lora_unet_transformer_blocks_5_attn1_to_q"
    assert LAYOUT.kohya_name(f"{SELF}.to_out.0", CONFIG) == "lora_unet_blocks_5_attn_proj"
    assert LAYOUT.kohya_name("no.such.module", CONFIG) == "lora_unet_no_such_module"
    generator = torch.Generator().manual_seed(6)
    loha = {
        f"{SELF}.to_k.{name}": torch.randn(shape, generator=generator)
        for name, shape in [("hada_w1_a", (WIDTH, 2)), ("hada_w1_b", (2, WIDTH)), ("hada_w2_a", (WIDTH, 2)),
                            ("hada_w2_b", (2, WIDTH))]
    }  # fmt: skip
    kohya = LAYOUT.to_kohya(LOHA, loha, 2.0, {f"{SELF}.to_k": 2}, CONFIG)
    assert {k.partition(".")[0] for k in kohya} == {"lora_unet_transformer_blocks_5_attn1_to_k"}
    read = LAYOUT.from_kohya(LOHA, kohya, CONFIG)
    assert read.alphas == {f"{SELF}.to_k": 2.0} and all(torch.equal(read.weights[k], v) for k, v in loha.items())

    lora = _adapter(f"{SELF}.to_v", 4, generator)
    named = lycoris_keys.to_kohya(LORA, lora, lambda m: LAYOUT.kohya_name(m, CONFIG), {f"{SELF}.to_v": 4.0}, {})
    weights, alphas, ranks, unknown = from_kohya(named)
    assert unknown == [] and ranks == {f"{SELF}.to_v": 4} and alphas == {f"{SELF}.to_v": 4.0}
    assert all(torch.equal(weights[k], v) for k, v in lora.items())
