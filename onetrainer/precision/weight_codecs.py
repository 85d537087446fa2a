"""The lossless coders behind FLOAT_W8A8_COMPRESSED and INT_W8A8_COMPRESSED, OneTrainer's compressed 8-bit weights: a
W8A8 Linear's 8-bit weight (`precision/quantize.CompressedW8A8Linear`) kept compressed by an entropy coder (NVIDIA
nvCOMP's ANS, on the GPU) and decompressed just for the layer's own forward and backward pass. The products and the
results are the W8A8 kind's, bit for bit; what changes is the memory the weights hold on the GPU and, with layer
offloading, the bytes each block's copy moves. A model's 8-bit weights are far from uniform (most are small), which is
what an entropy coder saves on (docs/benchmarks.md has figures); the cost is one decompression per use (the forward
pass, a checkpointed block's recomputation, the backward pass).

nvCOMP runs on CUDA only (the `nvidia-nvcomp-cu12` / `-cu13` packages): `unavailable_reason` says so before anything
loads. The layer reaches its codec through a registry by name, from a torch custom operator, so a compiled block calls
it as one opaque step; tests register a codec of their own.
"""

from __future__ import annotations

import sys
import threading
from typing import Protocol

import torch

from onetrainer.config.enums import COMPRESSED_WEIGHT_DTYPES, DataType


class WeightCodec(Protocol):
    """A lossless coder of bytes: `compress` takes a 1-D uint8 tensor and returns its compressed bytes on the same
    device; `decompress` returns the `size` original bytes on the blob's device."""

    name: str

    def compress(self, data: torch.Tensor) -> torch.Tensor: ...

    def decompress(self, blob: torch.Tensor, size: int) -> torch.Tensor: ...


CODECS: dict[str, WeightCodec] = {}


def register(codec: WeightCodec) -> WeightCodec:
    CODECS[codec.name] = codec
    return codec


class NvcompAns:
    """nvCOMP's ANS coder on one CUDA device. Coders are bound to a stream and are not shared between threads (the
    backward pass can run in another thread), so there is one per thread and stream."""

    def __init__(self, device: torch.device) -> None:
        from nvidia import nvcomp

        self._nvcomp = nvcomp
        self.device = device
        self.name = self.name_for(device)
        self._coders: dict[tuple[int, int], object] = {}
        self._configs: dict[tuple[int, int, int], object] = {}

    @staticmethod
    def name_for(device: torch.device) -> str:
        return f"nvcomp-ans:{device}"

    def _coder(self, stream: torch.cuda.Stream):
        key = (threading.get_ident(), stream.cuda_stream)
        coder = self._coders.get(key)
        if coder is None:
            coder = self._coders[key] = self._nvcomp.Codec(algorithm="ANS", cuda_stream=stream.cuda_stream)
        return coder

    def compress(self, data: torch.Tensor) -> torch.Tensor:
        if data.device != self.device:
            return self.compress(data.to(self.device)).to(data.device)
        stream = torch.cuda.current_stream(self.device)
        coder = self._coder(stream)
        encoded = coder.encode(self._nvcomp.as_array(data.contiguous(), cuda_stream=stream.cuda_stream))
        # The encoder's buffer is its worst-case size: keep the bytes it wrote.
        whole = torch.utils.dlpack.from_dlpack(encoded.to_dlpack(cuda_stream=stream.cuda_stream))
        return whole.view(torch.uint8).reshape(-1)[: encoded.buffer_size].clone()

    def decompress(self, blob: torch.Tensor, size: int) -> torch.Tensor:
        if blob.device.type != "cuda":
            return self.decompress(blob.to(self.device), size).to(blob.device)
        stream = torch.cuda.current_stream(blob.device)
        coder = self._coder(stream)
        key = (threading.get_ident(), stream.cuda_stream, size)
        config = self._configs.get(key)
        if config is None:  # depends on the size only; built once, without waiting for the GPU
            config = self._configs[key] = coder.decompression_config(coder.compression_config(size))
        out = torch.empty(size, dtype=torch.uint8, device=blob.device)
        array = self._nvcomp.as_array
        coder.decode(
            array(blob, cuda_stream=stream.cuda_stream),
            decompression_config=config,
            out=array(out, cuda_stream=stream.cuda_stream),
        )
        return out


_LOCK = threading.Lock()


def codec_for(device: str | torch.device) -> WeightCodec:
    """The codec that compresses weights for training on `device` (a CUDA device: nvCOMP's ANS)."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    with _LOCK:
        codec = CODECS.get(NvcompAns.name_for(device))
        return codec if codec is not None else register(NvcompAns(device))


def unavailable_reason(data_type: DataType, part: str, device: str | torch.device | None) -> str | None:
    """Why the `part` cannot be kept in `data_type` (a _COMPRESSED kind) when training on `device`; None when it can."""
    kind, plain = data_type.value, COMPRESSED_WEIGHT_DTYPES[data_type].value
    instead = f"choose {plain} (the same 8-bit weights, uncompressed) for the {part}"
    on_cuda = device is None or torch.device(device).type == "cuda"
    if not (on_cuda and torch.cuda.is_available()):
        where = "this machine has no CUDA GPU" if on_cuda else f"this run trains on '{device}'"
        return f"{kind} compresses the weights with NVIDIA nvCOMP, which needs a CUDA GPU, and {where}; {instead}"
    try:
        from nvidia import nvcomp  # noqa: F401
    except Exception as error:  # not installed, or built for another CUDA
        cuda = (torch.version.cuda or "12").split(".")[0]
        return (
            f"{kind} needs NVIDIA nvCOMP, which cannot be loaded here ({type(error).__name__}: {error}); install it "
            f"with `{sys.executable} -m pip install nvidia-nvcomp-cu{cuda}`, or {instead}"
        )
    return None


@torch.library.custom_op("onetrainer::decompress_weight", mutates_args=())
def _decompress(blob: torch.Tensor, codec: str, size: int, dtype: torch.dtype, shape: list[int]) -> torch.Tensor:
    return CODECS[codec].decompress(blob, size).view(dtype).view(shape)


@_decompress.register_fake
def _(blob: torch.Tensor, codec: str, size: int, dtype: torch.dtype, shape: list[int]) -> torch.Tensor:
    return blob.new_empty(shape, dtype=dtype)


def unpack(blob: torch.Tensor, layout: tuple) -> torch.Tensor:
    """The weight `blob` holds; `layout`: (codec name, byte size, dtype, shape)."""
    codec, size, dtype, shape = layout
    return torch.ops.onetrainer.decompress_weight(blob, codec, size, dtype, list(shape))
