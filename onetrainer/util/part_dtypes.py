"""Model parts in different dtypes meeting safely.

A preset keeps its denoiser in FLOAT_16 or BFLOAT_16 and its VAE in FLOAT_32 (the VAE overflows in half precision).
diffusers' pipelines hand one part's output to the next as it is, so a half-precision latent reaches a float32 conv
and torch refuses it. Inside `parts_meet_safely`, every part casts the floating tensors it is given to its own compute
dtype where it is entered: `forward`, and the `encode` / `decode` entry points of autoencoders (which pipelines call
directly). Each part therefore computes in the dtype it was configured with, as OneTrainer's samplers do with their
casts at each part's boundary.
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

FLOAT8 = (torch.float8_e4m3fn, torch.float8_e5m2)
# The methods through which a part is entered: `forward`, and the autoencoders' (AutoencoderKL, VQModel, …) own
# entry points, which pipelines call directly.
ENTRY_METHODS = ("forward", "encode", "decode")


def compute_weight(module: torch.nn.Module) -> torch.Tensor:
    """The module's first floating weight that it computes in: float8-stored weights (FLOAT_8 parts) and integer
    quantized ones compute in another dtype, so the first weight that is neither tells the dtype. Remembered per module
    (the step's entry casts and `predict` ask every step) for as long as that weight is still where it was found and
    still computes; its dtype is read from it live (`module.to(dtype)` keeps the parameter objects)."""
    remembered = _COMPUTE_WEIGHTS.get(module)
    if remembered is not None:
        path, owner_ref, name, weight_ref = remembered
        owner, weight = owner_ref(), weight_ref()
        if (
            weight is not None
            and _computes_in(weight)
            and owner is not None
            and owner._parameters.get(name) is weight
            and _submodule(module, path) is owner
        ):
            return weight
    fallback = None
    for qualified, parameter in module.named_parameters():
        if fallback is None:
            fallback = parameter
        if _computes_in(parameter):
            path, _, name = qualified.rpartition(".")
            # Weak references only: the owner may be the module itself, which a strong one would keep alive.
            _COMPUTE_WEIGHTS[module] = (path, weakref.ref(_submodule(module, path)), name, weakref.ref(parameter))
            return parameter
    if fallback is None:
        raise ValueError(f"{type(module).__name__} has no weights")
    return fallback


_COMPUTE_WEIGHTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _computes_in(parameter: torch.Tensor) -> bool:
    return parameter.is_floating_point() and parameter.dtype not in FLOAT8


def _submodule(module: torch.nn.Module, path: str) -> torch.nn.Module | None:
    try:
        return module.get_submodule(path) if path else module
    except AttributeError:  # the owner was removed since
        return None


_PLAIN = (int, float, bool, str, type(None))


def cast_floats(value: Any, dtype: torch.dtype) -> Any:
    """`value` with every floating tensor in it (also inside tuples, lists and dicts) cast to `dtype`; a container with
    nothing to cast is returned as it is."""
    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.is_floating_point() and value.dtype != dtype else value
    if type(value) in _PLAIN:
        return value
    if isinstance(value, dict):
        return {key: cast_floats(item, dtype) for key, item in value.items()}
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):  # not a namedtuple
        items = [cast_floats(item, dtype) for item in value]
        return value if all(a is b for a, b in zip(items, value)) else type(value)(items)
    return value


HALF = (torch.float16, torch.bfloat16)


def _casting_entry(module: torch.nn.Module, method: Callable) -> Callable:
    @functools.wraps(method)
    def entry(*args, **kwargs):
        # Read at every call, not once: a pipeline may upcast an fp16 VAE to float32 for its decode and back again.
        weight = compute_weight(module)
        dtype, device_type = weight.dtype, weight.device.type
        args, kwargs = cast_floats(args, dtype), cast_floats(kwargs, dtype)
        if dtype in HALF and torch.is_autocast_enabled(device_type) and torch.get_autocast_dtype(device_type) != dtype:
            # A part stored in one half type computes in it: under another half type's autocast its kernels would
            # meet mixed dtypes (bf16 weights, fp16 activations), and float16 overflows where bfloat16 does not.
            with torch.autocast(device_type, dtype=dtype):
                return method(*args, **kwargs)
        return method(*args, **kwargs)

    return entry


@contextlib.contextmanager
def parts_meet_safely(parts: Iterable[torch.nn.Module]) -> Iterator[None]:
    """For the duration, each of `parts` casts its floating inputs to its own compute dtype, and a part stored in a
    half type computes in that type under any autocast (see the module's docstring). Entering it again for the same
    parts changes nothing; everything is undone on leaving, also when the body raises."""
    patched: list[tuple[torch.nn.Module, str]] = []
    try:
        for module in parts:
            if next(module.parameters(), None) is None:
                continue
            for name in ENTRY_METHODS:
                method = getattr(type(module), name, None)
                if callable(method) and name not in vars(module):
                    vars(module)[name] = _casting_entry(module, getattr(module, name))
                    patched.append((module, name))
        yield
    finally:
        for module, name in patched:
            vars(module).pop(name, None)
