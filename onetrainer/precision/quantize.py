"""Quantized base weights for frozen parts: FLOAT_8 (stored as float8, computed in the training dtype layer by layer),
INT_8 (int8 with a scale per output channel, computed the same way), INT_W8A8 / FLOAT_W8A8 (8-bit weights that also
multiply in 8 bits, below) and NFLOAT_4 (bitsandbytes' 4-bit NormalFloat, which needs CUDA).

FLOAT_8: each Linear and Conv2d keeps its weight in float8_e4m3fn and casts it to the input's dtype just for its own
forward and backward (`_Float8Linear` / `_Float8Conv2d`), so it works on any device (a GPU without fp8 arithmetic
included: only the storage is fp8). diffusers' layerwise casting hooks do the same for inference, but cast the weight
back after the forward, which breaks the backward pass, and autograd would keep each upcast weight until then; our
autograd functions keep only the float8 weight and cast it again in the backward pass. Normalisation layers,
embeddings and biases keep the training dtype. Outputs are never written from these weights: only frozen parts are
quantized, and trained adapters keep their own dtype.

Layers a model class keeps out of low precision (transformers' `_keep_in_fp32_modules`: a text encoder's `wo`, whose
caller casts the hidden states to that layer's weight dtype) are not quantized, as transformers and OneTrainer do: they
keep the training dtype (float32 under FLOAT_16, where such a layer overflows).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from onetrainer.config.enums import COMPRESSED_WEIGHT_DTYPES, GGUF_WEIGHT_DTYPES, QUANTIZED_WEIGHT_DTYPES, DataType
from onetrainer.precision import weight_codecs
from onetrainer.precision.weight_codecs import CODECS, WeightCodec, unpack

if TYPE_CHECKING:
    from onetrainer.precision.svd_quant import SvdSettings

QUANTIZED = QUANTIZED_WEIGHT_DTYPES
FLOAT8 = torch.float8_e4m3fn
FLOAT8_MAX = 448.0  # the largest float8_e4m3fn value
INT8_MAX = 127.0
# Rows below which an 8-bit matmul does not pay (and CUDA's int8 kernel refuses): the dequantized weight is used.
W8A8_MIN_ROWS = 16
FLOAT_W8A8_NEEDS = (
    "{kind} multiplies in float8, which needs a CUDA GPU of compute capability 8.9 or newer (Ada, Hopper, "
    "Blackwell), and this one is {capability}; choose {instead} for the {part}"
)
_FLOAT8_PRODUCTS = {
    DataType.FLOAT_W8A8: "INT_W8A8, INT_8 or FLOAT_8",
    DataType.GGUF_A8_FLOAT: "GGUF_A8_INT or GGUF",
}
NF4_NEEDS_CUDA = (
    "NFLOAT_4 weights need bitsandbytes' CUDA kernels, and this machine has no CUDA device; choose FLOAT_8 (which "
    "works everywhere) or FLOAT_16 / BFLOAT_16 for the {part}"
)


@dataclass(frozen=True)
class QuantizationSettings:
    """What quantizing a part takes besides its weight dtype, built once per load from the config
    (`families/loading.quantization_settings`): the dtype the quantized layers compute in (the training dtype), the
    device that trains (which kinds it can hold, the compressed kinds' codec), SVDQuant's settings for the filtered
    part (None: off), and OneTrainer's quantization layer filter (its patterns, substrings or regular expressions;
    none: every layer)."""

    compute_dtype: torch.dtype
    train_device: str
    svd: SvdSettings | None
    layer_filter: tuple[str, ...]
    layer_filter_regex: bool


def is_quantized(data_type: DataType) -> bool:
    return data_type in QUANTIZED


def unsupported_reason(data_type: DataType, part: str, device: str | torch.device | None = None) -> str | None:
    """Why `data_type` cannot hold the `part`'s weights on this machine; None when it can."""
    if data_type in COMPRESSED_WEIGHT_DTYPES:
        reason = weight_codecs.unavailable_reason(data_type, part, device)
        if reason:
            return reason
        data_type = COMPRESSED_WEIGHT_DTYPES[data_type]
    if data_type is DataType.NFLOAT_4:
        cuda = torch.cuda.is_available() and (device is None or torch.device(device).type == "cuda")
        if not cuda:
            return NF4_NEEDS_CUDA.format(part=part)
    if data_type in _FLOAT8_PRODUCTS and _trains_on_cuda(device):
        capability = torch.cuda.get_device_capability(torch.device(device or "cuda"))
        if capability < (8, 9):
            return FLOAT_W8A8_NEEDS.format(
                kind=data_type.value, capability=".".join(map(str, capability)), part=part,
                instead=_FLOAT8_PRODUCTS[data_type],
            )  # fmt: skip
    return None


def _trains_on_cuda(device: str | torch.device | None) -> bool:
    if device is not None and torch.device(device).type != "cuda":
        return False
    return torch.cuda.is_available()


def quantize_part(
    name: str,
    module: torch.nn.Module,
    data_type: DataType,
    settings: QuantizationSettings,
    filtered: bool = False,
) -> bool:
    """Store a frozen part's weights quantized when its weight dtype `data_type` asks for it; False when it does not.
    `filtered`: only the layers the quantization layer filter names, with SVDQuant where it is on (OneTrainer applies
    both to the denoiser)."""
    if not is_quantized(data_type) and data_type not in GGUF_WEIGHT_DTYPES:
        return False
    reason = unsupported_reason(data_type, name, settings.train_device)
    if reason:
        raise ValueError(reason)
    dtype = settings.compute_dtype
    module.to(dtype=dtype)  # floating tensors only: a GGUF part's blocks stay as the file has them
    if data_type in GGUF_WEIGHT_DTYPES:
        return True  # quantized as it was read (`precision/gguf_weights.py`)
    kept = kept_unquantized(module)
    if dtype == torch.float16:
        for layer in kept:
            layer.to(dtype=torch.float32)
    if filtered:
        kept = kept + filtered_out(module, settings.layer_filter, settings.layer_filter_regex)
    svd = settings.svd if filtered else None
    if data_type is DataType.FLOAT_8:
        to_float8(module, kept, svd)
    elif data_type is DataType.NFLOAT_4:
        _to_nf4(module, dtype, kept)
    else:
        compressed = data_type in COMPRESSED_WEIGHT_DTYPES
        codec = weight_codecs.codec_for(settings.train_device) if compressed else None
        to_scaled_8bit(module, data_type, kept, svd, codec)
    return True


def svd_settings(rank: int, data_type: DataType, train_device: str, cache_dir: str | None) -> SvdSettings | None:
    """SVDQuant's settings for the denoiser's quantized Linears (`data_type` of the factors, NONE: off): the
    decomposition runs on the training GPU when there is one, cached under `cache_dir` (None: not cached)."""
    from pathlib import Path

    from onetrainer.precision.dtypes import torch_dtype
    from onetrainer.precision.svd_quant import SvdSettings

    if data_type in (None, DataType.NONE):
        return None
    device = torch.device(train_device) if _trains_on_cuda(train_device) else torch.device("cpu")
    return SvdSettings(rank, torch_dtype(data_type), device, Path(cache_dir) if cache_dir else None)


def filtered_out(module: torch.nn.Module, patterns: tuple[str, ...], regex: bool) -> list[torch.nn.Module]:
    """The Linear and Conv2d layers that OneTrainer's quantization filter (`patterns`: parts of layer names, or
    regular expressions) leaves in the training dtype; none without a filter."""
    from onetrainer.util.layer_filter import name_matches

    if not patterns:
        return []
    return [
        layer
        for layer_name, layer in module.named_modules()
        if type(layer) in (torch.nn.Linear, torch.nn.Conv2d) and not name_matches(layer_name, patterns, regex)
    ]


# A module attribute a family sets on a part whose code reads a layer's weight dtype to cast its input (diffusers'
# Z-Image timestep embedder casts to `mlp[0].weight.dtype`): those layers (attribute names) are not quantized.
KEEP_UNQUANTIZED = "_onetrainer_keep_unquantized"


def kept_unquantized(module: torch.nn.Module) -> list[torch.nn.Module]:
    """The layers of `module` its class keeps out of low precision (`_keep_in_fp32_modules`, matched by attribute
    name as transformers matches them) or its family does (`KEEP_UNQUANTIZED`): they are not quantized."""
    names = set(getattr(module, "_keep_in_fp32_modules", None) or ()) | set(getattr(module, KEEP_UNQUANTIZED, ()))
    return [layer for name, layer in module.named_modules() if name and name.rpartition(".")[2] in names]


def to_float8(module: torch.nn.Module, kept: list[torch.nn.Module] = (), svd: SvdSettings | None = None) -> None:
    """Store every Linear and Conv2d weight of `module` as float8 (frozen), computed in the input's dtype; the layers
    in `kept` (and those inside them) stay as they are. `svd`: the Linears keep a low-rank correction
    (`precision/svd_quant.py`) and store the rest."""
    skipped = {id(m) for layer in kept for m in layer.modules()}
    for layer in list(module.modules()):
        if id(layer) in skipped:
            continue
        low_rank = _split_off(layer, svd)
        if type(layer) is torch.nn.Linear:
            layer.__class__ = Float8Linear
        elif type(layer) is torch.nn.Conv2d:
            layer.__class__ = Float8Conv2d
        else:
            continue
        layer.weight = torch.nn.Parameter(layer.weight.data.to(FLOAT8), requires_grad=False)
        if layer.bias is not None:
            layer.bias.requires_grad_(False)
        _attach(layer, low_rank)


def _split_off(layer: torch.nn.Module, svd: SvdSettings | None) -> tuple[torch.Tensor, torch.Tensor] | None:
    """With SVDQuant, a plain Linear's low-rank factors, its weight left holding the residual; else None."""
    if svd is None or type(layer) is not torch.nn.Linear:
        return None
    from onetrainer.precision.svd_quant import split_low_rank

    up, down, residual = split_low_rank(layer.weight.data, svd)
    layer.weight.data = residual
    return up, down


def _attach(layer: torch.nn.Module, low_rank: tuple[torch.Tensor, torch.Tensor] | None) -> None:
    if low_rank is not None:
        from onetrainer.precision.svd_quant import attach_correction

        attach_correction(layer, *low_rank)


class _Float8LinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight8, bias):
        ctx.save_for_backward(weight8)
        weight = weight8.to(x.dtype)
        return torch.nn.functional.linear(x, weight, None if bias is None else bias.to(x.dtype))

    @staticmethod
    def backward(ctx, grad):
        (weight8,) = ctx.saved_tensors
        return grad @ weight8.to(grad.dtype), None, None


class _Float8Conv2dFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight8, bias, stride, padding, dilation, groups):
        ctx.save_for_backward(weight8)
        ctx.conv = (x.shape, stride, padding, dilation, groups)
        bias = None if bias is None else bias.to(x.dtype)
        return torch.nn.functional.conv2d(x, weight8.to(x.dtype), bias, stride, padding, dilation, groups)

    @staticmethod
    def backward(ctx, grad):
        (weight8,) = ctx.saved_tensors
        shape, stride, padding, dilation, groups = ctx.conv
        grad_x = torch.nn.grad.conv2d_input(shape, weight8.to(grad.dtype), grad, stride, padding, dilation, groups)
        return grad_x, None, None, None, None, None, None


# peft creates an adapter in its base layer's weight dtype unless the layer names a `compute_dtype` (as bitsandbytes'
# layers do); None: no cast. A float8 weight would round a new adapter's initial values to float8 before the LoRA
# method casts them to the adapter's own dtype.
NO_ADAPTER_CAST = None


class Float8Linear(torch.nn.Linear):
    """A frozen Linear whose weight is stored as float8."""

    compute_dtype = NO_ADAPTER_CAST

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _Float8LinearFunction.apply(x, self.weight, self.bias)


class Float8Conv2d(torch.nn.Conv2d):
    """A frozen Conv2d whose weight is stored as float8 (zero padding only, as in the diffusion models)."""

    compute_dtype = NO_ADAPTER_CAST

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.padding_mode != "zeros":
            raise ValueError("FLOAT_8 convolutions support zero padding only")
        return _Float8Conv2dFunction.apply(
            x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups
        )


# -- INT_8, INT_W8A8, FLOAT_W8A8: 8-bit weights with a scale per output channel ------------------------------------
#
# INT_8 stores int8 weights and computes with the weight dequantized (like FLOAT_8, with a scale). The W8A8 kinds also
# quantize each row of the input (a token) to 8 bits with its own scale and multiply in 8 bits (`torch._int_mm`,
# `torch._scaled_mm`), then scale the result back: faster on GPUs with 8-bit tensor cores, and it runs on a CPU.
# The backward pass, which a LoRA below needs for its input's gradient, multiplies by the dequantized weight.


def quantize_rows(weight: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """`weight` (out, …) as `dtype` (int8 or float8_e4m3fn) with one float32 scale per output row: weight ≈ q·scale."""
    flat = weight.detach().float().reshape(weight.shape[0], -1)
    limit = INT8_MAX if dtype == torch.int8 else FLOAT8_MAX
    scale = (flat.abs().amax(dim=1) / limit).clamp(min=1e-12)
    scaled = flat / scale[:, None]
    quantized = scaled.round().clamp(-INT8_MAX, INT8_MAX) if dtype == torch.int8 else scaled
    return quantized.to(dtype).reshape(weight.shape), scale


def dequantized(weight: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    shape = (-1,) + (1,) * (weight.dim() - 1)
    return weight.to(dtype) * scale.reshape(shape).to(device=weight.device, dtype=dtype)


class _ScaledStateMixin:
    """The state dict of a plain layer: the weight dequantized to float32 (a fine-tune's pipeline folder or backup
    holds no int8 tensors and no scales); a floating weight loaded into it is quantized again."""

    weight: torch.nn.Parameter
    weight_scale: torch.Tensor
    compute_dtype = NO_ADAPTER_CAST

    def weight8(self) -> torch.Tensor:
        """The 8-bit weight (a compressed layer decompresses it)."""
        return self.weight.detach()

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)  # type: ignore[misc]
        destination[prefix + "weight"] = dequantized(self.weight8(), self.weight_scale, torch.float32)
        destination.pop(prefix + "weight_scale", None)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        weight = state_dict.get(prefix + "weight")
        if weight is not None and weight.dtype != self.weight.dtype:
            quantized, scale = quantize_rows(weight, self.weight.dtype)
            state_dict = {**state_dict, prefix + "weight": quantized, prefix + "weight_scale": scale}
        elif prefix + "weight_scale" not in state_dict:
            state_dict = {**state_dict, prefix + "weight_scale": self.weight_scale}
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)  # type: ignore[misc]


def to_scaled_8bit(
    module: torch.nn.Module,
    data_type: DataType,
    kept: list[torch.nn.Module] = (),
    svd: SvdSettings | None = None,
    codec: WeightCodec | None = None,
) -> None:
    """Store every Linear and Conv2d weight of `module` (but those in `kept`) in 8 bits with a scale per output
    channel: INT_8 and INT_W8A8 as int8, FLOAT_W8A8 as float8; the W8A8 kinds also multiply their Linears in 8 bits.
    `svd`: the Linears keep a low-rank correction (`precision/svd_quant.py`) and store the rest. `codec`: the W8A8
    Linears keep their 8-bit weight compressed (the _COMPRESSED kinds, `precision/weight_codecs.py`)."""
    data_type = COMPRESSED_WEIGHT_DTYPES.get(data_type, data_type)
    storage = FLOAT8 if data_type is DataType.FLOAT_W8A8 else torch.int8
    w8a8 = data_type in (DataType.INT_W8A8, DataType.FLOAT_W8A8)
    skipped = {id(m) for layer in kept for m in layer.modules()}
    for layer in list(module.modules()):
        if id(layer) in skipped:
            continue
        low_rank = _split_off(layer, svd)
        if type(layer) is torch.nn.Linear:
            layer.__class__ = W8A8Linear if w8a8 else Scaled8BitLinear
        elif type(layer) is torch.nn.Conv2d:
            layer.__class__ = Scaled8BitConv2d
        else:
            continue
        weight, scale = quantize_rows(layer.weight.data, storage)
        layer.weight = torch.nn.Parameter(weight, requires_grad=False)
        layer.register_buffer("weight_scale", scale)
        if layer.bias is not None:
            layer.bias.requires_grad_(False)
        if codec is not None and w8a8 and type(layer) is W8A8Linear:
            compress_layer(layer, codec)
        _attach(layer, low_rank)


class _Scaled8BitLinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight8, scale, bias, w8a8):
        ctx.save_for_backward(weight8, scale)
        return scaled_linear(x, weight8, scale, bias, w8a8)

    @staticmethod
    def backward(ctx, grad):
        weight8, scale = ctx.saved_tensors
        return grad @ dequantized(weight8, scale, grad.dtype), None, None, None, None


def scaled_linear(
    x: torch.Tensor, weight8: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None, w8a8: bool
) -> torch.Tensor:
    """An 8-bit Linear's output: in 8 bits where `w8a8` and the kernels take the shapes, else with the weight
    dequantized; in autocast's dtype under autocast."""
    if torch.is_autocast_enabled(x.device.type):
        # As autocast would cast a linear layer's input (a norm's output arrives in float32): the product, its
        # output and so the backward pass's gradient stay in the compute dtype. In float32 the 8-bit product took
        # the slow path and the backward ran float32 matrix products, 2.4 times the step of FLOAT_8 on an H200.
        x = x.to(torch.get_autocast_dtype(x.device.type))
    bias = None if bias is None else bias.to(x.dtype)
    if not (w8a8 and eight_bit_product_fits(x, weight8)):
        return torch.nn.functional.linear(x, dequantized(weight8, scale, x.dtype), bias)
    return linear_8bit(x, weight8, scale, bias)


def eight_bit_product_fits(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the 8-bit kernels take x·weightᵀ's shapes: any on a CPU; on CUDA more than 16 rows (tokens) and widths
    in 16s."""
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    if x.device.type == "cpu":
        return rows > 0
    out_features, in_features = weight.shape
    return rows > W8A8_MIN_ROWS and in_features % 16 == 0 and out_features % 16 == 0


def linear_8bit(x: torch.Tensor, weight8: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x·(weight8·scale)ᵀ + bias multiplied in 8 bits (each row of x quantized with its own scale), in x's dtype."""
    out = _matmul_8bit(x.reshape(-1, x.shape[-1]), weight8, scale).to(x.dtype)
    if bias is not None:
        out = out + bias
    return out.reshape(*x.shape[:-1], weight8.shape[0])


def _matmul_8bit(rows: torch.Tensor, weight8: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """rows @ (weight8·scale)ᵀ with each row quantized to the weight's 8-bit type, in float32 (bfloat16 where the
    float8 product scales its rows in the kernel)."""
    if weight8.dtype != torch.int8 and _row_scaled_float8(rows):
        return _matmul_float8_row_scaled(rows, weight8, scale)
    limit = INT8_MAX if weight8.dtype == torch.int8 else FLOAT8_MAX
    values = rows.float()
    row_scale = (values.abs().amax(dim=1, keepdim=True) / limit).clamp(min=1e-12)
    scaled = values / row_scale
    if weight8.dtype == torch.int8:
        product = torch._int_mm(scaled.round().clamp(-INT8_MAX, INT8_MAX).to(torch.int8), weight8.t()).float()
    else:
        one = torch.ones((), device=rows.device)
        product = torch._scaled_mm(scaled.to(FLOAT8), weight8.t(), scale_a=one, scale_b=one, out_dtype=torch.float32)
    return product * row_scale * scale[None, :]


def _row_scaled_float8(rows: torch.Tensor) -> bool:
    """Whether `torch._scaled_mm` can apply a scale per row and per column itself: bfloat16 inputs on a CUDA GPU of
    compute capability 9.0 or newer (Hopper, Blackwell)."""
    if rows.device.type != "cuda" or rows.dtype != torch.bfloat16:
        return False
    return torch.cuda.get_device_capability(rows.device) >= (9, 0)


def _matmul_float8_row_scaled(rows: torch.Tensor, weight8: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """FLOAT_W8A8's product with both scales applied in the kernel's epilogue and the rows quantized in bfloat16: two
    fewer passes over the output and no float32 copy of the input (on an H200, a large transformer's layer took 0.79 ms
    the other way against bfloat16's 0.44, and 0.38 ms this way: docs/benchmarks.md)."""
    row_scale = (rows.abs().amax(dim=1, keepdim=True).float() / FLOAT8_MAX).clamp(min=1e-12)
    quantized = (rows * (1.0 / row_scale).to(rows.dtype)).clamp(-FLOAT8_MAX, FLOAT8_MAX).to(FLOAT8)
    column_scale = scale.float().reshape(1, -1)
    return torch._scaled_mm(quantized, weight8.t(), scale_a=row_scale, scale_b=column_scale, out_dtype=rows.dtype)


class Scaled8BitLinear(_ScaledStateMixin, torch.nn.Linear):
    """A frozen Linear whose weight is int8 or float8 with a scale per output channel (`weight_scale`), computed with
    the weight dequantized to the input's dtype (INT_8)."""

    weight_scale: torch.Tensor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _Scaled8BitLinearFunction.apply(x, self.weight, self.weight_scale, self.bias, False)


class W8A8Linear(Scaled8BitLinear):
    """A Scaled8BitLinear that also quantizes its input per row and multiplies in 8 bits (INT_W8A8, FLOAT_W8A8)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _Scaled8BitLinearFunction.apply(x, self.weight, self.weight_scale, self.bias, True)


# -- INT_W8A8_COMPRESSED, FLOAT_W8A8_COMPRESSED: the W8A8 weight kept compressed (`precision/weight_codecs.py`) -------


class _CompressedLinearFunction(torch.autograd.Function):
    """W8A8's product with the weight decompressed in the forward and again in the backward pass: only the compressed
    bytes are kept between the two."""

    @staticmethod
    def forward(ctx, x, blob, scale, bias, layout):
        ctx.save_for_backward(blob, scale)
        ctx.layout = layout
        return scaled_linear(x, unpack(blob, layout), scale, bias, True)

    @staticmethod
    def backward(ctx, grad):
        blob, scale = ctx.saved_tensors
        return grad @ dequantized(unpack(blob, ctx.layout), scale, grad.dtype), None, None, None, None


class CompressedW8A8Linear(W8A8Linear):
    """A W8A8Linear whose `weight` holds its 8-bit weight's compressed bytes (uint8, frozen); `compression` is
    (codec name, byte size, 8-bit dtype, shape). Its state dict is a plain layer's, as the W8A8 layer's is."""

    compression: tuple[str, int, torch.dtype, tuple[int, ...]]

    def weight8(self) -> torch.Tensor:
        return unpack(self.weight.detach(), self.compression)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _CompressedLinearFunction.apply(x, self.weight, self.weight_scale, self.bias, self.compression)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, *args):
        weight = state_dict.get(prefix + "weight")
        if weight is None:
            return super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, *args)
        codec, _size, dtype, _shape = self.compression
        quantized, scale = quantize_rows(weight, dtype)
        _store(self, quantized.to(self.weight_scale.device), CODECS[codec])
        self.weight_scale.copy_(scale)
        rest = {k: v for k, v in state_dict.items() if k not in (prefix + "weight", prefix + "weight_scale")}
        torch.nn.Module._load_from_state_dict(self, rest, prefix, local_metadata, strict, missing_keys, *args)
        for key in (prefix + "weight", prefix + "weight_scale"):
            if key in missing_keys:
                missing_keys.remove(key)


def _store(layer: CompressedW8A8Linear, weight8: torch.Tensor, codec: WeightCodec) -> None:
    size = weight8.numel() * weight8.element_size()
    layer.compression = (codec.name, size, weight8.dtype, tuple(weight8.shape))
    blob = codec.compress(weight8.contiguous().view(torch.uint8).reshape(-1))
    layer.weight = torch.nn.Parameter(blob, requires_grad=False)


def compress_layer(layer: W8A8Linear, codec: WeightCodec) -> None:
    """Keep `layer`'s 8-bit weight compressed by `codec` (the layer becomes a CompressedW8A8Linear)."""
    weight8 = layer.weight.data
    layer.__class__ = CompressedW8A8Linear
    _store(layer, weight8, codec)


def compressed_bytes(module: torch.nn.Module) -> tuple[int, int]:
    """(compressed, uncompressed) bytes of `module`'s compressed weights."""
    layers = [m for m in module.modules() if isinstance(m, CompressedW8A8Linear)]
    return sum(m.weight.numel() for m in layers), sum(m.compression[1] for m in layers)


class _Scaled8BitConv2dFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight8, scale, bias, stride, padding, dilation, groups):
        ctx.save_for_backward(weight8, scale)
        ctx.conv = (x.shape, stride, padding, dilation, groups)
        bias = None if bias is None else bias.to(x.dtype)
        weight = dequantized(weight8, scale, x.dtype)
        return torch.nn.functional.conv2d(x, weight, bias, stride, padding, dilation, groups)

    @staticmethod
    def backward(ctx, grad):
        weight8, scale = ctx.saved_tensors
        shape, stride, padding, dilation, groups = ctx.conv
        weight = dequantized(weight8, scale, grad.dtype)
        grad_x = torch.nn.grad.conv2d_input(shape, weight, grad, stride, padding, dilation, groups)
        return grad_x, None, None, None, None, None, None, None


class Scaled8BitConv2d(_ScaledStateMixin, torch.nn.Conv2d):
    """A frozen Conv2d whose weight is 8-bit with a scale per output channel (zero padding only)."""

    weight_scale: torch.Tensor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.padding_mode != "zeros":
            raise ValueError("8-bit convolutions support zero padding only")
        return _Scaled8BitConv2dFunction.apply(
            x, self.weight, self.weight_scale, self.bias, self.stride, self.padding, self.dilation, self.groups
        )


def _to_nf4(module: torch.nn.Module, dtype: torch.dtype, kept: list[torch.nn.Module] = ()) -> None:
    """Replace each Linear but those in `kept` by bitsandbytes' 4-bit Linear (quantized when moved to the CUDA
    device)."""
    import bitsandbytes as bnb

    skipped = {id(m) for layer in kept for m in layer.modules()}
    for parent in list(module.modules()):
        for child_name, child in list(parent.named_children()):
            if type(child) is torch.nn.Linear and id(child) not in skipped:
                replacement = bnb.nn.Linear4bit(
                    child.in_features,
                    child.out_features,
                    bias=child.bias is not None,
                    compute_dtype=dtype,
                    quant_type="nf4",
                    device="meta",
                )
                replacement.weight = bnb.nn.Params4bit(
                    child.weight.data.to(dtype), requires_grad=False, quant_type="nf4"
                )
                if child.bias is not None:
                    replacement.bias = torch.nn.Parameter(child.bias.data.to(dtype), requires_grad=False)
                setattr(parent, child_name, replacement)


def is_float8(tensor: torch.Tensor) -> bool:
    return tensor.dtype in (torch.float8_e4m3fn, torch.float8_e5m2)
