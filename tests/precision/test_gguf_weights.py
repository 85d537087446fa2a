"""GGUF base weights: a tiny Flux / Chroma transformer written as a .gguf file (Q8_0, Q4_0, Q5_0 blocks, BF16 norms)
loads through the family as `transformer.model_name` with a GGUF weight dtype, predicts as the weights it was made
from, trains a LoRA that diffusers loads (offloaded or not, with 8-bit products too), and the config checks and the
estimate know what such a part is."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from onetrainer.config import config_from_dict
from onetrainer.precision import gguf_weights
from onetrainer.tiny.gguf_file import write_gguf_transformer
from onetrainer.training.events import Metrics
from tests.helpers import image_folder, local_config, run_config, tiny_config

ALL_KINDS = ("Q8_0", "Q4_0", "Q5_0")


@pytest.fixture(scope="module")
def gguf_files(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("gguf")
    return {
        "q8": write_gguf_transformer(folder / "flux-q8.gguf", kinds=("Q8_0",)),
        "mixed": write_gguf_transformer(folder / "flux-mixed.gguf", kinds=ALL_KINDS),
        "chroma": write_gguf_transformer(folder / "chroma-q8.gguf", variant="chroma"),
    }


def _config(root: Path, gguf: Path, variant: str = "flux-dev", dtype: str = "GGUF", **overrides):
    data = tiny_config(
        root, variant=variant, transformer={"model_name": str(gguf), "weight_dtype": dtype},
        text_encoder={"train": False}, **overrides,
    )  # fmt: skip
    if variant != "chroma":
        data["text_encoder_2"] = {"train": False}
    return data


def _problems(data: dict) -> list[str]:
    _, problems = config_from_dict(data)
    return [f"{p.path}: {p.message}" for p in problems if p.is_error]


def test_the_block_decoders_match_the_gguf_packages_own():
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize as reference
    from gguf.quants import quantize

    values = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    for name in (*ALL_KINDS, "BF16"):
        kind = GGMLQuantizationType[name]
        blocks = quantize(values, kind)
        ours = gguf_weights.dequantize(torch.from_numpy(blocks), int(kind), torch.float32)
        assert ours.shape == (4, 64)
        assert np.allclose(ours.numpy(), reference(blocks, kind), atol=1e-6), name


def test_the_k_quant_decoders_match_the_gguf_packages_own():
    """The downloaded files are mostly K-quants (256 weights a block), which the gguf package decodes but cannot
    write: random blocks with sane float16 scales (at the byte offsets of each layout) stand in for a file's."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    from gguf.quants import dequantize as reference

    rng = np.random.default_rng(0)
    scale = np.frombuffer(np.float16(0.01).tobytes(), dtype=np.uint8)
    for name, offsets in (("Q4_K", (0, 2)), ("Q5_K", (0, 2)), ("Q6_K", (208,))):
        kind = GGMLQuantizationType[name]
        _, type_size = GGML_QUANT_SIZES[kind]
        blocks = rng.integers(0, 256, size=(6, type_size), dtype=np.uint8)
        for offset in offsets:
            blocks[:, offset : offset + 2] = scale
        rows = blocks.reshape(3, 2 * type_size)  # 3 rows of 512 weights
        ours = gguf_weights.dequantize(torch.from_numpy(rows), int(kind), torch.float32)
        assert ours.shape == (3, 512)
        assert np.array_equal(ours.numpy(), reference(rows, kind)), name


@pytest.mark.parametrize(("variant", "file"), [("flux-dev", "q8"), ("chroma", "chroma")])
def test_a_gguf_transformer_loads_quantized_and_predicts_as_its_source(gguf_files, tmp_path, variant, file):
    from onetrainer.families import load_family_class
    from onetrainer.tiny import tiny_model_dir

    config, problems = config_from_dict(_config(tmp_path, gguf_files[file], variant=variant))
    assert not [p for p in problems if p.is_error]
    family = load_family_class(config.model_type)()
    gguf_model = family.load(local_config(config))
    transformer = gguf_model.part("transformer")
    layers = [m for m in transformer.modules() if isinstance(m, gguf_weights.GgufLinear)]
    assert layers and all(m.weight.dtype == torch.uint8 and not m.weight.requires_grad for m in layers)
    assert type(layers[0].weight) is torch.nn.Parameter  # a plain parameter: layer offloading can move it

    cls = type(transformer)
    source = cls.from_pretrained(tiny_model_dir(variant), subfolder="transformer")
    torch.manual_seed(0)
    tokens, text = 16, 4
    inputs = {
        "hidden_states": torch.randn(1, tokens, source.config.in_channels),
        "encoder_hidden_states": torch.randn(1, text, source.config.joint_attention_dim),
        "timestep": torch.tensor([0.5]), "img_ids": torch.zeros(tokens, 3), "txt_ids": torch.zeros(text, 3),
        "return_dict": False,
    }  # fmt: skip
    if variant != "chroma":
        inputs |= {"pooled_projections": torch.randn(1, source.config.pooled_projection_dim), "guidance": torch.ones(1)}
    with torch.no_grad():
        expected = source(**inputs)[0]
        got = transformer.float()(**inputs)[0]
    assert (got - expected).abs().max() < 0.05 * expected.abs().max()  # Q8_0 blocks: within a few percent
    saved = transformer.state_dict()  # a plain layer's layout: the weights dequantized
    name = next(n for n, m in transformer.named_modules() if m is layers[0])
    assert saved[f"{name}.weight"].dtype == torch.float32
    assert saved[f"{name}.weight"].shape == (layers[0].out_features, layers[0].in_features)


def test_a_lora_trains_on_gguf_weights_offloaded_or_not_and_loads_in_diffusers(gguf_files, tmp_path):
    """The mixed file (Q8_0, Q4_0, Q5_0): the same losses and LoRA with half the blocks offloaded as without, and the
    LoRA file loads into diffusers' Flux transformer; GGUF_A8_INT multiplies in 8 bits and trains too."""
    from diffusers import FluxTransformer2DModel
    from safetensors.torch import load_file

    from onetrainer.tiny import tiny_model_dir

    def train(name: str, **transformer) -> tuple[list[float], dict]:
        root = tmp_path / name
        image_folder(root, count=2)
        destination = root / "out" / "lora.safetensors"
        data = _config(
            root, gguf_files["mixed"], epochs=1, output_model_format="DIFFUSERS_LORA",
            output_model_destination=str(destination), layer_filter_preset="attn-mlp",
        )  # fmt: skip
        data["transformer"] |= {"gradient_checkpointing": True, **transformer}
        events = run_config(data)
        return [e.loss for e in events if isinstance(e, Metrics)], load_file(str(destination))

    losses, lora = train("plain")
    offloaded_losses, offloaded_lora = train("offloaded", offload_fraction=0.5)
    assert losses and all(np.isfinite(losses))
    assert losses == offloaded_losses
    assert lora.keys() == offloaded_lora.keys() and all(torch.equal(lora[k], offloaded_lora[k]) for k in lora)
    eight_bit, _ = train("eight-bit", weight_dtype="GGUF_A8_INT")
    assert eight_bit and all(np.isfinite(eight_bit))

    transformer = FluxTransformer2DModel.from_pretrained(tiny_model_dir("flux-dev"), subfolder="transformer")
    transformer.load_lora_adapter(str(tmp_path / "plain" / "out" / "lora.safetensors"), adapter_name="gguf")
    adapted = [n for n, p in transformer.named_parameters() if "lora_" in n]
    assert len(adapted) == len(lora)


def test_the_config_checks_name_what_a_gguf_part_needs(tmp_path, gguf_files):
    gguf = gguf_files["q8"]
    assert _problems(_config(tmp_path, gguf)) == []
    no_file = _config(tmp_path, gguf)
    no_file["transformer"]["model_name"] = ""
    assert any(p.startswith("transformer.model_name:") and ".gguf" in p for p in _problems(no_file))
    wrong_dtype = _config(tmp_path, gguf, dtype="FLOAT_8")
    assert any(p.startswith("transformer.weight_dtype:") and "GGUF" in p for p in _problems(wrong_dtype))
    fine_tune = _config(tmp_path, gguf, method="FINE_TUNE")
    fine_tune["transformer"]["train"] = True
    assert any("frozen weights only" in p for p in _problems(fine_tune))
    dora = _config(tmp_path, gguf, lora_decompose=True)
    assert any("DoRA reads the base weight" in p for p in _problems(dora))
    pixart = tiny_config(tmp_path, variant="pixart", transformer={"model_name": str(gguf), "weight_dtype": "GGUF"})
    assert any("cannot load" in p for p in _problems(pixart))


def test_the_estimate_counts_the_files_bytes_per_weight(tmp_path, gguf_files):
    from onetrainer.training.estimate import counts_of, model_shapes

    assert gguf_weights.gguf_bytes_per_weight(gguf_files["q8"]) == pytest.approx(34 / 32)  # Q8_0: 32 int8 + fp16
    mixed = gguf_weights.gguf_bytes_per_weight(gguf_files["mixed"])
    assert 18 / 32 < mixed < 34 / 32  # Q4_0 (18 bytes a block) and Q5_0 (22) beside Q8_0
    config, _ = config_from_dict(_config(tmp_path, gguf_files["mixed"]))
    config = local_config(config)
    shapes, _ = model_shapes(config)
    count = counts_of(config, shapes)["transformer"]
    assert count.quantized_bytes == pytest.approx(mixed)
    quantized = count.params - count.plain
    assert count.bytes == pytest.approx(quantized * mixed + count.plain * count.plain_bytes)
