"""INT_8, INT_W8A8 and FLOAT_W8A8 layers: 8-bit weights with a scale per output channel, the W8A8 ones multiplying in
8 bits (`torch._int_mm` / `torch._scaled_mm`, which run on a CPU too). Checked against the float layer they replace:
outputs and input gradients close, the stored bytes a quarter, the state dict that of a plain layer."""

from __future__ import annotations

import pytest
import torch

from onetrainer.config.enums import DataType
from onetrainer.precision.quantize import (
    Scaled8BitConv2d,
    Scaled8BitLinear,
    W8A8Linear,
    quantize_rows,
    to_scaled_8bit,
)

KINDS = [DataType.INT_8, DataType.INT_W8A8, DataType.FLOAT_W8A8]
# Relative error of the output against the float layer: int8 rounding per channel (and per token for the activations),
# float8's 3-bit mantissa.
TOLERANCE = {DataType.INT_8: 0.02, DataType.INT_W8A8: 0.03, DataType.FLOAT_W8A8: 0.12}


def _net() -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(48, 64), torch.nn.GELU(), torch.nn.Linear(64, 32))


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).detach().norm() / b.detach().norm())


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.value)
def test_outputs_and_input_gradients_stay_close_to_the_float_layers(kind):
    reference, quantized = _net(), _net()
    to_scaled_8bit(quantized, kind)
    expected_class = Scaled8BitLinear if kind is DataType.INT_8 else W8A8Linear
    assert type(quantized[0]) is expected_class and not quantized[0].weight.requires_grad
    storage = torch.float8_e4m3fn if kind is DataType.FLOAT_W8A8 else torch.int8
    assert quantized[0].weight.dtype == storage and quantized[0].weight_scale.shape == (64,)

    x = torch.randn(3, 40, 48)  # 120 tokens: the 8-bit matmul path
    x_ref, x_q = x.clone().requires_grad_(), x.clone().requires_grad_()
    out_ref, out_q = reference(x_ref), quantized(x_q)
    assert out_q.shape == out_ref.shape and out_q.dtype == out_ref.dtype
    assert _relative(out_q, out_ref) < TOLERANCE[kind]
    out_ref.square().sum().backward()
    out_q.square().sum().backward()
    assert _relative(x_q.grad, x_ref.grad) < 2 * TOLERANCE[kind]


def test_the_w8a8_matmul_is_what_it_says():
    # int8 × int8 in int32, scaled back: exactly the product of the dequantized operands (up to float32 rounding)
    torch.manual_seed(1)
    layer = torch.nn.Linear(32, 16, bias=False)
    to_scaled_8bit(layer, DataType.INT_W8A8)
    x = torch.randn(20, 32)
    x8, x_scale = quantize_rows(x, torch.int8)
    expected = (x8.float() * x_scale[:, None]) @ (layer.weight.float() * layer.weight_scale[:, None]).t()
    assert torch.allclose(layer(x), expected, atol=1e-5, rtol=1e-5)


def test_a_convolution_keeps_8bit_weights_and_computes_in_the_input_dtype():
    torch.manual_seed(2)
    reference = torch.nn.Conv2d(4, 8, 3, padding=1)
    quantized = torch.nn.Conv2d(4, 8, 3, padding=1)
    quantized.load_state_dict(reference.state_dict())
    to_scaled_8bit(quantized, DataType.INT_W8A8)
    assert type(quantized) is Scaled8BitConv2d and quantized.weight.dtype == torch.int8
    x = torch.randn(2, 4, 8, 8, requires_grad=True)
    assert _relative(quantized(x), reference(x)) < 0.02


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.value)
def test_the_state_dict_is_a_plain_layers_and_loads_back(kind):
    reference, quantized = _net(), _net()
    to_scaled_8bit(quantized, kind)
    state = quantized.state_dict()
    assert set(state) == set(reference.state_dict())  # no scales: a pipeline folder of plain weights
    assert all(v.dtype == torch.float32 for v in state.values())
    assert _relative(state["0.weight"], reference.state_dict()["0.weight"]) < TOLERANCE[kind]
    again = _net()
    to_scaled_8bit(again, kind)
    again.load_state_dict(reference.state_dict())  # a float weight is quantized on the way in
    assert torch.equal(again[0].weight, quantized[0].weight)
    assert torch.allclose(again[0].weight_scale, quantized[0].weight_scale)


def test_stored_bytes_are_a_quarter():
    net = _net()
    floats = sum(p.numel() * 4 for p in net.parameters())
    to_scaled_8bit(net, DataType.INT_8)
    stored = sum(t.numel() * t.element_size() for t in (*net.parameters(), *net.buffers()))
    assert stored < 0.3 * floats


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.value)
def test_under_autocast_a_float32_input_computes_in_the_autocast_dtype(kind):
    """A norm's float32 output reaching the layer is cast as autocast casts a linear layer's input: the product, the
    output and the gradient flowing back stay in bfloat16 (in float32 the backward ran float32 matrix products)."""
    layer = torch.nn.Linear(64, 32)
    to_scaled_8bit(layer, kind)
    x = torch.randn(20, 64, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = layer(x)
    assert out.dtype == torch.bfloat16
    out.float().sum().backward()
    assert x.grad is not None and x.grad.dtype == torch.float32  # autograd hands the input's dtype back
    plain = layer(x.detach())  # outside autocast: float32 throughout
    assert plain.dtype == torch.float32 and _relative(out.float(), plain) < TOLERANCE[kind] + 0.02
