"""Quantized base weights for frozen parts: FLOAT_8 (stored as float8, computed in the training dtype layer by layer)
and NFLOAT_4 (bitsandbytes' 4-bit NormalFloat, which needs CUDA).

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

from typing import TYPE_CHECKING

import torch

from onetrainer.config.enums import DataType

if TYPE_CHECKING:
    from onetrainer.config import TrainConfig

QUANTIZED = frozenset({DataType.FLOAT_8, DataType.NFLOAT_4})
FLOAT8 = torch.float8_e4m3fn
NF4_NEEDS_CUDA = (
    "NFLOAT_4 weights need bitsandbytes' CUDA kernels, and this machine has no CUDA device; choose FLOAT_8 (which "
    "works everywhere) or FLOAT_16 / BFLOAT_16 for the {part}"
)


def is_quantized(data_type: DataType) -> bool:
    return data_type in QUANTIZED


def compute_dtype(config: TrainConfig) -> torch.dtype:
    from onetrainer.util.dtypes import torch_dtype

    return torch_dtype(config.train_dtype)


def unsupported_reason(data_type: DataType, part: str, device: str | torch.device | None = None) -> str | None:
    """Why `data_type` cannot hold the `part`'s weights on this machine; None when it can."""
    if data_type is DataType.NFLOAT_4:
        cuda = torch.cuda.is_available() and (device is None or torch.device(device).type == "cuda")
        if not cuda:
            return NF4_NEEDS_CUDA.format(part=part)
    return None


def quantize_part(name: str, module: torch.nn.Module, config: TrainConfig) -> bool:
    """Store a frozen part's weights quantized when its weight dtype asks for it; False when it does not."""
    data_type = config.part(name).weight_dtype
    if not is_quantized(data_type):
        return False
    reason = unsupported_reason(data_type, name, config.train_device)
    if reason:
        raise ValueError(reason)
    dtype = compute_dtype(config)
    module.to(dtype=dtype)
    kept = kept_unquantized(module)
    if dtype == torch.float16:
        for layer in kept:
            layer.to(dtype=torch.float32)
    if data_type is DataType.FLOAT_8:
        to_float8(module, kept)
    else:
        _to_nf4(module, dtype, kept)
    return True


def kept_unquantized(module: torch.nn.Module) -> list[torch.nn.Module]:
    """The layers of `module` its class keeps out of low precision (`_keep_in_fp32_modules`, matched by attribute
    name as transformers matches them): they are not quantized."""
    names = set(getattr(module, "_keep_in_fp32_modules", None) or ())
    return [layer for name, layer in module.named_modules() if name and name.rpartition(".")[2] in names]


def to_float8(module: torch.nn.Module, kept: list[torch.nn.Module] = ()) -> None:
    """Store every Linear and Conv2d weight of `module` as float8 (frozen), computed in the input's dtype; the layers
    in `kept` (and those inside them) stay as they are."""
    skipped = {id(m) for layer in kept for m in layer.modules()}
    for layer in module.modules():
        if id(layer) in skipped:
            continue
        if type(layer) is torch.nn.Linear:
            layer.__class__ = Float8Linear
        elif type(layer) is torch.nn.Conv2d:
            layer.__class__ = Float8Conv2d
        else:
            continue
        layer.weight = torch.nn.Parameter(layer.weight.data.to(FLOAT8), requires_grad=False)
        if layer.bias is not None:
            layer.bias.requires_grad_(False)


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


class Float8Linear(torch.nn.Linear):
    """A frozen Linear whose weight is stored as float8."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _Float8LinearFunction.apply(x, self.weight, self.bias)


class Float8Conv2d(torch.nn.Conv2d):
    """A frozen Conv2d whose weight is stored as float8 (zero padding only, as in the diffusion models)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.padding_mode != "zeros":
            raise ValueError("FLOAT_8 convolutions support zero padding only")
        return _Float8Conv2dFunction.apply(
            x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups
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
