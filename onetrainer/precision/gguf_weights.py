"""GGUF base weights: a transformer read pre-quantized from a .gguf file (the Q8_0, Q5_K, Q4_K… files people download
for the large transformers), frozen, with LoRAs trained on top.

The file is read by diffusers' GGUF loader (the `gguf` package underneath). Each Linear layer whose weight the file
holds quantized becomes a `GgufLinear`: its weight stays the file's raw blocks (uint8, a plain parameter, so layer
offloading moves it like any frozen weight) and is dequantized with diffusers' block decoders each time the layer runs,
in the forward pass and again in the backward pass (autograd keeps the raw blocks, not a dequantized copy). Tensors
stored in a float format (F32, F16, BF16), and any quantized tensor outside a Linear layer, become ordinary weights.

GGUF_A8_INT and GGUF_A8_FLOAT (OneTrainer's kinds) multiply the dequantized weight in 8 bits: the weight and each row
of the input quantized per row to int8 or float8, as INT_W8A8 / FLOAT_W8A8 do (`precision/quantize.py`).

A GGUF layer's state dict holds its weight dequantized to float32 (the layout of a plain Linear); loading float
weights into one is refused, as nothing here writes GGUF blocks.
"""

from __future__ import annotations

import functools
import os

import torch

from onetrainer.config.enums import GGUF_WEIGHT_DTYPES, DataType


def _float_types() -> set:
    from gguf import GGMLQuantizationType as Q

    return {Q.F32, Q.F16, Q.BF16}


def read_gguf(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Every tensor of a .gguf file by name: quantized ones as diffusers' `GGUFParameter` (raw blocks with their
    `quant_type` and logical `quant_shape`), float ones as tensors. Errors name the file."""
    try:
        from diffusers.models.model_loading_utils import load_gguf_checkpoint
    except ImportError as e:  # pragma: no cover - both are dependencies
        raise ValueError(f"reading {path} needs diffusers and the gguf package: {e}") from e
    try:
        return load_gguf_checkpoint(os.fspath(path))
    except (ValueError, OSError, KeyError) as e:
        raise ValueError(f"{os.fspath(path)} is not a GGUF file this trainer can read: {e}") from e


def logical_shape(tensor: torch.Tensor) -> tuple[int, ...]:
    """The shape a tensor has once dequantized (a GGUF-quantized one's last dimension counts bytes; diffusers'
    `GGUFParameter` keeps the real one as `quant_shape`); any other tensor's own shape."""
    return tuple(getattr(tensor, "quant_shape", None) or tensor.shape)


def quant_type_of(tensor: torch.Tensor) -> int | None:
    """The GGML type of a quantized tensor (None for float tensors and for GGUF's float types)."""
    found = getattr(tensor, "quant_type", None)
    if found is None or found in _float_types():
        return None
    return int(found)


def dequantize(raw: torch.Tensor, quant_type: int, dtype: torch.dtype) -> torch.Tensor:
    """GGML blocks (uint8, rows of blocks) → the weight in `dtype`, by diffusers' decoders on the tensor's device."""
    from diffusers.quantizers.gguf.utils import dequantize_functions
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    kind = GGMLQuantizationType(quant_type)
    block_size, type_size = GGML_QUANT_SIZES[kind]
    data = raw if type(raw) is torch.Tensor else raw.as_subclass(torch.Tensor)  # no subclass dispatch per op
    if data.dtype != torch.uint8:
        data = data.view(torch.uint8)
    shape = (*data.shape[:-1], data.shape[-1] // type_size * block_size)
    blocks = data.reshape(-1, type_size)
    # The blocks' scales are float16: decoded in float16 unless float32 is asked for (then exactly).
    decoded = dequantize_functions[kind](
        blocks, block_size, type_size, dtype=torch.float32 if dtype == torch.float32 else None
    )
    return decoded.reshape(shape).to(dtype)


def to_plain(tensor: torch.Tensor) -> torch.Tensor:
    """A tensor of the file as an ordinary one: GGUF's BF16 (which arrives as blocks too) in bfloat16, a quantized
    tensor outside a Linear layer dequantized to float32."""
    found = getattr(tensor, "quant_type", None)
    if found is None:
        return tensor
    return dequantize(tensor, int(found), _torch_float(found) if found in _float_types() else torch.float32)


def _torch_float(kind) -> torch.dtype:
    from gguf import GGMLQuantizationType as Q

    return {Q.F32: torch.float32, Q.F16: torch.float16, Q.BF16: torch.bfloat16}[kind]


def prepare_gguf_layers(module: torch.nn.Module, state: dict[str, torch.Tensor], data_type: DataType) -> int:
    """Turn the Linear layers whose weight `state` holds quantized into `GgufLinear` (8-bit products for the A8
    kinds), before `state` is loaded into `module`; every other GGUF tensor in `state` becomes an ordinary tensor.
    Returns the number of GGUF layers."""
    if data_type not in GGUF_WEIGHT_DTYPES:
        raise ValueError(f"{data_type.value} is not a GGUF weight dtype")
    linears = {name for name, layer in module.named_modules() if type(layer) is torch.nn.Linear}
    eight_bit = {DataType.GGUF_A8_INT: torch.int8, DataType.GGUF_A8_FLOAT: torch.float8_e4m3fn}.get(data_type)
    count = 0
    for key, value in list(state.items()):
        owner, _, name = key.rpartition(".")
        if name == "weight" and owner in linears and quant_type_of(value) is not None:
            layer = module.get_submodule(owner)
            layer.__class__ = GgufLinear
            layer.eight_bit = eight_bit
            layer.requires_grad_(False)
            count += 1
        elif getattr(value, "quant_type", None) is not None:
            state[key] = to_plain(value)
    return count


class _GgufLinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, raw, bias, quant_type, eight_bit):
        from onetrainer.precision.quantize import eight_bit_product_fits, linear_8bit, quantize_rows

        ctx.save_for_backward(raw)
        ctx.quant_type = quant_type
        weight = dequantize(raw, quant_type, x.dtype)
        bias = None if bias is None else bias.to(x.dtype)
        if eight_bit is None or not eight_bit_product_fits(x, weight):
            return torch.nn.functional.linear(x, weight, bias)
        return linear_8bit(x, *quantize_rows(weight, eight_bit), bias)

    @staticmethod
    def backward(ctx, grad):
        (raw,) = ctx.saved_tensors
        return grad @ dequantize(raw, ctx.quant_type, grad.dtype), None, None, None, None


class GgufLinear(torch.nn.Linear):
    """A frozen Linear whose weight is a GGUF file's raw blocks (`quant_type`), dequantized on use."""

    quant_type: int
    eight_bit: torch.dtype | None = None  # GGUF_A8_INT / GGUF_A8_FLOAT: the 8-bit type of the products

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _GgufLinearFunction.apply(x, self.weight, self.bias, self.quant_type, self.eight_bit)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, errors):
        key = prefix + "weight"
        value = state_dict.get(key)
        kind = None if value is None else quant_type_of(value)
        if value is not None and kind is None:
            errors.append(f"{key}: a GGUF layer keeps the file's quantized weight; it cannot load a float one")
            return
        if value is not None:
            raw = value.as_subclass(torch.Tensor).detach()
            self.weight = torch.nn.Parameter(raw, requires_grad=False)
            self.quant_type = kind
            state_dict = {k: v for k, v in state_dict.items() if k != key}
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, errors)
        if value is not None and key in missing_keys:
            missing_keys.remove(key)

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        destination[prefix + "weight"] = dequantize(self.weight.detach(), self.quant_type, torch.float32)


def gguf_bytes_per_weight(path: str | os.PathLike) -> float | None:
    """The bytes a quantized weight of the file takes per element (Q8_0: 1.06, Q4_K: 0.56), from its header alone;
    None when the file cannot be read or holds nothing quantized."""
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return _bytes_per_weight(os.fspath(path), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=8)
def _bytes_per_weight(path: str, _mtime_ns: int, _size: int) -> float | None:
    """Cached by the file's identity: the estimate asks again on every change to the config."""
    try:
        from gguf import GGML_QUANT_SIZES, GGUFReader
    except ImportError:  # pragma: no cover - a dependency
        return None
    try:
        reader = GGUFReader(path)
    except (OSError, ValueError):
        return None
    stored = elements = 0
    floats = _float_types()
    for tensor in reader.tensors:
        if tensor.tensor_type in floats:
            continue
        block_size, type_size = GGML_QUANT_SIZES[tensor.tensor_type]
        count = int(tensor.n_elements)
        elements += count
        stored += count // block_size * type_size
    return stored / elements if elements else None
