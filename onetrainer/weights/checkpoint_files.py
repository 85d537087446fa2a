"""Reading checkpoint files: safetensors, and legacy `.ckpt` pickles without executing any pickled code."""

from __future__ import annotations

import json
import os
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import torch

SAFETENSORS_HEADER_LIMIT = 100_000_000  # the safetensors format's own bound on its JSON header


def read_safetensors_header(path: str | os.PathLike) -> dict[str, Any]:
    """The JSON header of a safetensors file (tensor name → dtype, shape, data_offsets; "__metadata__"), without
    reading the tensors."""
    with open(path, "rb") as f:
        return parse_safetensors_header(f)


def parse_safetensors_header(file: BinaryIO) -> dict[str, Any]:
    """The header of the safetensors file open at its start, leaving it at the first tensor's bytes. ValueError when
    the file does not start with one (too short, a length beyond the format's bound, not JSON)."""
    head = file.read(8)
    length = int.from_bytes(head, "little")
    if len(head) < 8 or length > SAFETENSORS_HEADER_LIMIT:
        raise ValueError(f"{getattr(file, 'name', 'the file')} does not start with a safetensors header")
    header = json.loads(file.read(length))
    if not isinstance(header, dict):
        raise ValueError(f"{getattr(file, 'name', 'the file')} does not start with a safetensors header")
    return header


def read_safetensors_metadata(path: str | os.PathLike) -> dict[str, str]:
    """The header metadata of a safetensors file (without reading the tensors)."""
    return dict(read_safetensors_header(path).get("__metadata__") or {})


# The floating dtypes of a safetensors header.
_SAFETENSORS_FLOATS = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
}


def stored_float_dtype(path: str | os.PathLike, prefix: str = "") -> torch.dtype | None:
    """The one dtype a safetensors file stores all its floating tensors under `prefix` in, from its header alone; None
    where they are of several dtypes, where there are none, or for a file of another format (not read)."""
    if Path(path).suffix.lower() != ".safetensors":
        return None
    header = read_safetensors_header(path)
    found = {
        _SAFETENSORS_FLOATS[info["dtype"]]
        for key, info in header.items()
        if key != "__metadata__" and key.startswith(prefix) and info.get("dtype") in _SAFETENSORS_FLOATS
    }
    return found.pop() if len(found) == 1 else None


# What `load_state_dict` casts a floating tensor to: one dtype for all, or a function of the tensor's name (None: kept
# as the file stores it).
ReadDtype = torch.dtype | Callable[[str], torch.dtype | None] | None


def load_state_dict(path: str | os.PathLike, dtype: ReadDtype = None) -> dict[str, torch.Tensor]:
    """All tensors of a checkpoint file; a nested `state_dict` (legacy checkpoints) is unwrapped. `dtype`: each floating
    tensor cast as it is read (a safetensors file's tensors one at a time, so the file is never in memory in its own,
    wider dtype beside them); None: as the file stores them."""
    path = Path(path)
    if path.suffix.lower() == ".safetensors":
        from safetensors import safe_open
        from safetensors.torch import load_file

        if dtype is None:
            return load_file(str(path))
        with safe_open(str(path), "pt") as f:
            return {key: _read_as(key, f.get_tensor(key), dtype) for key in f.keys()}  # noqa: SIM118 (not a dict)
    data = _load_pickle_safely(path)
    while isinstance(data, dict) and "state_dict" in data and isinstance(data["state_dict"], dict):
        data = data["state_dict"]
    if not isinstance(data, dict):
        raise ValueError(f"{path} does not hold a state dict")
    state = {}
    for key in [k for k, v in data.items() if isinstance(v, torch.Tensor)]:
        state[key] = _read_as(key, data.pop(key), dtype)  # popped: the stored tensor is let go as its cast is made
    return state


def _read_as(key: str, tensor: torch.Tensor, dtype: ReadDtype) -> torch.Tensor:
    wanted = dtype(key) if callable(dtype) else dtype
    if wanted is None or not tensor.is_floating_point():
        return tensor
    return tensor.to(wanted)


class _Inert:
    """Stands in for any class a legacy checkpoint names (trainer callbacks, …): it is never run."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        pass

    def __call__(self, *args: Any, **kwargs: Any) -> _Inert:
        return _Inert()  # a reduce chain (e.g. getattr(cls, name)()) stays inert at every step


class _InertUnpickler(pickle.Unpickler):
    # Only torch's tensor-rebuilding functions and plain containers are resolved; every other global becomes _Inert,
    # so no constructor, reducer or function from the file is ever executed.
    _ALLOWED_MODULES = ("torch", "collections", "numpy.core.multiarray", "numpy", "_codecs")

    def find_class(self, module: str, name: str) -> Any:
        if module == "collections" and name == "OrderedDict":
            import collections

            return collections.OrderedDict
        if module.startswith("torch") and (name.startswith("_rebuild") or name.endswith("Storage") or name == "device"):
            return super().find_class(module, name)
        if module == "torch" and name in ("Size", "float16", "float32", "bfloat16"):
            return super().find_class(module, name)
        return _Inert


class _InertPickleModule:
    Unpickler = _InertUnpickler
    load = pickle.load
    __name__ = "inert_pickle"


def _load_pickle_safely(path: Path) -> Any:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        # weights_only refuses files that name other classes (e.g. pytorch-lightning callbacks). Load the tensors and
        # replace those objects with inert stand-ins instead.
        try:
            return torch.load(path, map_location="cpu", weights_only=False, pickle_module=_InertPickleModule)
        except Exception as e:
            raise ValueError(f"{path} is not a checkpoint file that can be read ({type(e).__name__})") from None
    except (RuntimeError, ValueError, EOFError, OSError) as e:
        raise ValueError(f"{path} is not a checkpoint file that can be read ({type(e).__name__}: {e})") from None


def without_prefix(state: dict, prefixes: tuple[str, ...] = ("model.diffusion_model.", "diffusion_model.")) -> dict:
    """A single file's weights without the prefix ComfyUI saves a diffusion model under, where all have it."""
    for prefix in prefixes:
        if state and all(k.startswith(prefix) for k in state):
            return {k[len(prefix) :]: v for k, v in state.items()}
    return dict(state)
