"""INT_W8A8_COMPRESSED and FLOAT_W8A8_COMPRESSED layers: the W8A8 layer's 8-bit weight kept compressed and decompressed
for each use. nvCOMP needs a CUDA GPU, so these tests give the layers a lossless coder of their own (zlib on the CPU)
through the same registry (`precision/weight_codecs.py`); the nvCOMP coder is checked on a GPU (docs/benchmarks.md)."""

from __future__ import annotations

import sys
import zlib

import pytest
import torch

from onetrainer.config.enums import DataType
from onetrainer.precision import weight_codecs
from onetrainer.precision.quantize import (
    CompressedW8A8Linear,
    W8A8Linear,
    compressed_bytes,
    to_scaled_8bit,
    unsupported_reason,
)
from onetrainer.precision.weight_codecs import unavailable_reason

KINDS = {DataType.INT_W8A8_COMPRESSED: DataType.INT_W8A8, DataType.FLOAT_W8A8_COMPRESSED: DataType.FLOAT_W8A8}


class ZlibCodec:
    """A lossless coder on the CPU, counting its decompressions."""

    name = "test-zlib"

    def __init__(self) -> None:
        self.decompressed = 0

    def compress(self, data: torch.Tensor) -> torch.Tensor:
        coder = zlib.compressobj(9, zlib.DEFLATED, 15, 9, zlib.Z_HUFFMAN_ONLY)  # an entropy coder, as ANS is
        packed = coder.compress(data.cpu().numpy().tobytes()) + coder.flush()
        return torch.frombuffer(bytearray(packed), dtype=torch.uint8).to(data.device)

    def decompress(self, blob: torch.Tensor, size: int) -> torch.Tensor:
        self.decompressed += 1
        raw = zlib.decompress(blob.cpu().numpy().tobytes())
        assert len(raw) == size
        return torch.frombuffer(bytearray(raw), dtype=torch.uint8).to(blob.device)


@pytest.fixture
def codec(monkeypatch) -> ZlibCodec:
    coder = ZlibCodec()
    monkeypatch.setitem(weight_codecs.CODECS, coder.name, coder)
    return coder


def _net() -> torch.nn.Sequential:
    """Weights drawn as a trained model's are (most of them small, a few large): their 8-bit values compress."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(48, 64), torch.nn.GELU(), torch.nn.Linear(64, 32))
    with torch.no_grad():
        for layer in (net[0], net[2]):
            layer.weight.copy_(torch.distributions.Laplace(0.0, 0.02).sample(layer.weight.shape))
    return net


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.value)
def test_a_compressed_layer_computes_exactly_what_the_w8a8_layer_does(codec, kind):
    plain, packed = _net(), _net()
    to_scaled_8bit(plain, KINDS[kind])
    to_scaled_8bit(packed, kind, codec=codec)
    layer = packed[0]
    assert type(layer) is CompressedW8A8Linear and type(plain[0]) is W8A8Linear
    assert layer.weight.dtype == torch.uint8 and not layer.weight.requires_grad
    assert torch.equal(layer.weight8(), plain[0].weight.detach())  # lossless
    stored, size = compressed_bytes(packed)
    assert size == 48 * 64 + 64 * 32 and stored < 0.95 * size

    x = torch.randn(3, 40, 48)  # 120 tokens: the 8-bit product
    x_plain, x_packed = x.clone().requires_grad_(), x.clone().requires_grad_()
    out_plain, out_packed = plain(x_plain), packed(x_packed)
    assert torch.equal(out_packed, out_plain)
    codec.decompressed = 0
    out_plain.square().sum().backward()
    out_packed.square().sum().backward()
    assert torch.equal(x_packed.grad, x_plain.grad)
    # the backward pass decompressed each weight again: only the compressed bytes were kept from the forward pass
    assert codec.decompressed == 2


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.value)
def test_the_state_dict_is_a_plain_layers_and_loads_back(codec, kind):
    plain, packed = _net(), _net()
    to_scaled_8bit(plain, KINDS[kind])
    to_scaled_8bit(packed, kind, codec=codec)
    state = packed.state_dict()
    assert set(state) == set(torch.nn.Sequential(torch.nn.Linear(48, 64), torch.nn.GELU(), torch.nn.Linear(64, 32))
                             .state_dict())  # fmt: skip
    assert all(torch.equal(state[k], v) for k, v in plain.state_dict().items())
    assert state["0.weight"].dtype == torch.float32

    again = torch.nn.Sequential(torch.nn.Linear(48, 64), torch.nn.GELU(), torch.nn.Linear(64, 32))
    to_scaled_8bit(again, kind, codec=codec)
    result = again.load_state_dict(state)
    assert not result.missing_keys and not result.unexpected_keys
    x = torch.randn(20, 48)
    assert torch.equal(again(x), packed(x))


def test_svd_quant_corrects_a_compressed_layer_as_the_plain_one(codec):
    from onetrainer.precision.svd_quant import SvdSettings

    svd = SvdSettings(4, torch.float32, torch.device("cpu"), None)
    plain, packed = _net(), _net()
    to_scaled_8bit(plain, DataType.INT_W8A8, svd=svd)
    to_scaled_8bit(packed, DataType.INT_W8A8_COMPRESSED, svd=svd, codec=codec)
    assert isinstance(packed[0], CompressedW8A8Linear) and packed[0].svd_up.shape == (64, 4)
    x = torch.randn(20, 48)
    assert torch.equal(packed(x), plain(x))
    assert all(torch.equal(packed.state_dict()[k], v) for k, v in plain.state_dict().items())


def test_without_cuda_the_reason_names_the_kind_the_part_and_the_device(monkeypatch):
    reason = unavailable_reason(DataType.INT_W8A8_COMPRESSED, "transformer", "cpu")
    assert reason.startswith("INT_W8A8_COMPRESSED compresses the weights with NVIDIA nvCOMP, which needs a CUDA GPU")
    assert "this run trains on 'cpu'" in reason and "choose INT_W8A8" in reason and "for the transformer" in reason
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    reason = unsupported_reason(DataType.FLOAT_W8A8_COMPRESSED, "unet", "cuda")
    assert "this machine has no CUDA GPU" in reason and "choose FLOAT_W8A8" in reason and "for the unet" in reason


def test_on_a_gpu_without_nvcomp_the_reason_says_how_to_install_it(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setitem(sys.modules, "nvidia.nvcomp", None)  # an import of it fails
    monkeypatch.setitem(sys.modules, "nvidia", None)
    reason = unavailable_reason(DataType.INT_W8A8_COMPRESSED, "transformer", "cuda:0")
    assert reason.startswith("INT_W8A8_COMPRESSED needs NVIDIA nvCOMP, which cannot be loaded here (ModuleNotFound")
    assert f"{sys.executable} -m pip install nvidia-nvcomp-cu13" in reason and "or choose INT_W8A8" in reason
