"""PixArt's native checkpoint layout ↔ diffusers, on the real 28-layer topology at tiny width (512 and 1024 models)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from onetrainer.tiny import components
from onetrainer.tiny import reference as ref
from onetrainer.tiny.pixart import TRANSFORMER_HEADS
from onetrainer.weights import pixart_keys

REAL_1024 = ref.PIXART_ALPHA_TRANSFORMER
REAL_512 = {**ref.PIXART_ALPHA_TRANSFORMER, "sample_size": 64}
WIDTH = TRANSFORMER_HEADS * components.HEAD_WIDTH
CAPTION_CHANNELS = 32


def _tiny(real: dict) -> dict:
    return components.tiny_config(
        "transformer",
        real,
        num_attention_heads=TRANSFORMER_HEADS,
        attention_head_dim=components.HEAD_WIDTH,
        cross_attention_dim=WIDTH,
        caption_channels=CAPTION_CHANNELS,
    )


@pytest.fixture(scope="module", params=[REAL_512, REAL_1024], ids=["512", "1024"])
def model(request) -> torch.nn.Module:
    return components.build(_tiny(request.param), seed=3, component="transformer")


def _config(model: torch.nn.Module) -> dict:
    return dict(model.config)


def _expected_native_keys(layers: int, micro_conditions: bool) -> set[str]:
    """The keys of PixArt-XL-2-{512x512,1024-MS}.pth, after the names diffusers' conversion script pops."""
    names = [
        "pos_embed",
        "x_embedder.proj.weight",
        "x_embedder.proj.bias",
        "y_embedder.y_embedding",
        "y_embedder.y_proj.fc1.weight",
        "y_embedder.y_proj.fc1.bias",
        "y_embedder.y_proj.fc2.weight",
        "y_embedder.y_proj.fc2.bias",
        "t_embedder.mlp.0.weight",
        "t_embedder.mlp.0.bias",
        "t_embedder.mlp.2.weight",
        "t_embedder.mlp.2.bias",
        "t_block.1.weight",
        "t_block.1.bias",
        "final_layer.linear.weight",
        "final_layer.linear.bias",
        "final_layer.scale_shift_table",
    ]
    if micro_conditions:
        names += [f"{e}_embedder.mlp.{i}.{p}" for e in ("csize", "ar") for i in (0, 2) for p in ("weight", "bias")]
    block = [
        "scale_shift_table",
        "attn.qkv.weight",
        "attn.qkv.bias",
        "attn.proj.weight",
        "attn.proj.bias",
        "cross_attn.q_linear.weight",
        "cross_attn.q_linear.bias",
        "cross_attn.kv_linear.weight",
        "cross_attn.kv_linear.bias",
        "cross_attn.proj.weight",
        "cross_attn.proj.bias",
        "mlp.fc1.weight",
        "mlp.fc1.bias",
        "mlp.fc2.weight",
        "mlp.fc2.bias",
    ]
    names += [f"blocks.{n}.{name}" for n in range(layers) for name in block]
    return set(names)


@pytest.mark.parametrize("real", [REAL_512, REAL_1024], ids=["512", "1024"])
def test_native_keys_are_the_real_checkpoints_keys(real: dict) -> None:
    expected = _expected_native_keys(28, micro_conditions=real["sample_size"] == 128)
    assert pixart_keys.native_keys(real) == expected
    assert pixart_keys.has_micro_conditions(real) == (real["sample_size"] == 128)


def test_every_key_maps_and_the_round_trip_is_identical(model: torch.nn.Module) -> None:
    config = _config(model)
    state = model.state_dict()
    assert set(state) == pixart_keys.diffusers_keys(config)  # nothing of the model is left unmapped

    native = pixart_keys.diffusers_to_native(state, config)
    assert set(native) == _expected_native_keys(28, pixart_keys.has_micro_conditions(config))
    back, extras = pixart_keys.native_to_diffusers(native, config)
    assert set(back) == set(state)
    for key, value in state.items():
        assert torch.equal(back[key], value), key
    assert set(extras) == {"pos_embed", "y_embedder.y_embedding"}

    fresh = type(model).from_config(model.config)
    fresh.load_state_dict(back, strict=True)


def test_fused_rows_are_q_k_v_in_order(model: torch.nn.Module) -> None:
    native = pixart_keys.diffusers_to_native(model.state_dict(), _config(model))
    block = model.transformer_blocks[27]
    x = torch.randn(5, WIDTH)
    with torch.no_grad():
        q, k, v = (x @ native["blocks.27.attn.qkv.weight"].T + native["blocks.27.attn.qkv.bias"]).chunk(3, dim=-1)
        assert torch.allclose(q, block.attn1.to_q(x)) and torch.allclose(k, block.attn1.to_k(x))
        assert torch.allclose(v, block.attn1.to_v(x))
        kv = x @ native["blocks.27.cross_attn.kv_linear.weight"].T + native["blocks.27.cross_attn.kv_linear.bias"]
        k2, v2 = kv.chunk(2, dim=-1)
        assert torch.allclose(k2, block.attn2.to_k(x)) and torch.allclose(v2, block.attn2.to_v(x))
    assert native["blocks.27.attn.qkv.weight"].shape == (3 * WIDTH, WIDTH)
    assert native["blocks.27.cross_attn.kv_linear.weight"].shape == (2 * WIDTH, WIDTH)


def _pixart_pos_embed(width: int, grid: int, lewei_scale: float, base_size: int) -> np.ndarray:
    """PixArt's own formula: positions scaled by base_size / grid / lewei_scale; the first half of the channels
    encodes the column (the meshgrid puts w first), sin then cos per half."""
    positions = np.arange(grid, dtype=np.float32) / (grid / base_size) / lewei_scale
    rows, columns = np.meshgrid(positions, positions, indexing="ij")
    omega = 1.0 / 10000 ** (np.arange(width // 4, dtype=np.float64) / (width / 4))

    def encode(pos: np.ndarray) -> np.ndarray:
        angles = np.outer(pos.reshape(-1), omega)
        return np.concatenate([np.sin(angles), np.cos(angles)], axis=1)

    return np.concatenate([encode(columns), encode(rows)], axis=1)


def test_pos_embed_is_pixarts_table_and_diffusers_buffer(model: torch.nn.Module) -> None:
    config = _config(model)
    table = pixart_keys.diffusers_to_native(model.state_dict(), config)["pos_embed"]
    grid = config["sample_size"] // config["patch_size"]
    assert table.shape == (1, grid * grid, WIDTH)
    assert torch.allclose(table, model.pos_embed.pos_embed.float(), atol=1e-6)
    # PixArt's inference script: lewei_scale 1 for 512, 2 for 1024; base size input_size / patch.
    lewei = {64: 1.0, 128: 2.0}[config["sample_size"]]
    expected = _pixart_pos_embed(WIDTH, grid, lewei, base_size=grid)
    assert np.allclose(table[0].numpy(), expected, atol=1e-5)


def test_y_embedding_is_kept_or_zeros(model: torch.nn.Module) -> None:
    config = _config(model)
    native = pixart_keys.diffusers_to_native(model.state_dict(), config)
    assert native["y_embedder.y_embedding"].shape == (120, CAPTION_CHANNELS)
    assert not native["y_embedder.y_embedding"].any()

    learned = torch.randn(120, CAPTION_CHANNELS)
    native["y_embedder.y_embedding"] = learned
    state, extras = pixart_keys.native_to_diffusers(native, config)
    again = pixart_keys.diffusers_to_native(state, config, y_embedding=extras["y_embedder.y_embedding"])
    assert torch.equal(again["y_embedder.y_embedding"], learned)
    sigma = pixart_keys.diffusers_to_native(state, config, caption_tokens=300)
    assert sigma["y_embedder.y_embedding"].shape == (300, CAPTION_CHANNELS)


def test_native_only_tensors_may_be_absent(model: torch.nn.Module) -> None:
    config = _config(model)
    native = pixart_keys.diffusers_to_native(model.state_dict(), config)
    del native["pos_embed"], native["y_embedder.y_embedding"]
    state, extras = pixart_keys.native_to_diffusers(native, config)
    assert set(state) == set(model.state_dict()) and extras == {}


def test_leftovers_and_gaps_are_named_both_ways(model: torch.nn.Module) -> None:
    config = _config(model)
    state = dict(model.state_dict())
    native = pixart_keys.diffusers_to_native(state, config)

    broken = {**native, "blocks.28.attn.qkv.weight": torch.zeros(1)}
    del broken["blocks.3.cross_attn.kv_linear.bias"]
    with pytest.raises(ValueError, match=r"missing blocks\.3\.cross_attn\.kv_linear\.bias; unexpected blocks\.28"):
        pixart_keys.native_to_diffusers(broken, config)

    del state["transformer_blocks.0.attn1.to_k.weight"]
    with pytest.raises(ValueError, match=r"missing transformer_blocks\.0\.attn1\.to_k\.weight"):
        pixart_keys.diffusers_to_native(state, config)


@pytest.mark.parametrize("suffix", [".pth", ".safetensors"])
def test_reads_original_files(model: torch.nn.Module, tmp_path: Path, suffix: str) -> None:
    config = _config(model)
    native = {k: v.contiguous() for k, v in pixart_keys.diffusers_to_native(model.state_dict(), config).items()}
    path = tmp_path / f"PixArt-XL-2{suffix}"
    if suffix == ".pth":
        torch.save({"state_dict": native}, path)  # the released files wrap the weights like this
    else:
        save_file(native, path)
    state, extras = pixart_keys.read_native_checkpoint(path, config)
    for key, value in model.state_dict().items():
        assert torch.equal(state[key], value), key
    assert torch.equal(extras["y_embedder.y_embedding"], native["y_embedder.y_embedding"])


def test_a_512_checkpoint_with_the_1024_config_names_the_file(tmp_path: Path) -> None:
    small = components.build(_tiny(REAL_512), seed=3, component="transformer")
    path = tmp_path / "PixArt-XL-2-512x512.safetensors"
    native = pixart_keys.diffusers_to_native(small.state_dict(), dict(small.config))
    save_file({k: v.contiguous() for k, v in native.items()}, path)
    with pytest.raises(ValueError, match=r"PixArt-XL-2-512x512\.safetensors: .*missing ar_embedder\.mlp\.0\.bias"):
        pixart_keys.read_native_checkpoint(path, _tiny(REAL_1024))


def test_topology_is_read_from_a_native_checkpoint(model: torch.nn.Module) -> None:
    config = _config(model)
    native = pixart_keys.diffusers_to_native(model.state_dict(), config)
    micro = config["sample_size"] == 128
    expected = {"num_layers": 28, "patch_size": 2, "sample_size": config["sample_size"], "caption_tokens": 120}
    assert pixart_keys.native_topology(native) == {**expected, "use_additional_conditions": micro}
    del native["pos_embed"], native["y_embedder.y_embedding"]
    assert pixart_keys.native_topology(native)["sample_size"] == config["sample_size"]
    with pytest.raises(ValueError, match="x_embedder"):
        pixart_keys.native_topology({"blocks.0.attn.qkv.weight": torch.zeros(1)})
