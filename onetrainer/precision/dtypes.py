"""The config's data types as torch dtypes."""

from __future__ import annotations

import torch

from onetrainer.config.enums import DataType

_TORCH = {
    DataType.FLOAT_32: torch.float32,
    DataType.TFLOAT_32: torch.float32,
    DataType.FLOAT_16: torch.float16,
    DataType.BFLOAT_16: torch.bfloat16,
}


def torch_dtype(data_type: DataType) -> torch.dtype:
    try:
        return _TORCH[data_type]
    except KeyError:
        raise ValueError(f"{data_type.value} has no torch dtype here") from None


def fallback_dtype(train_dtype: DataType, fallback_train_dtype: DataType) -> DataType:
    """The precision for parts that are unstable in FLOAT_16 (the VAE): the fallback dtype when training in FLOAT_16."""
    return fallback_train_dtype if train_dtype is DataType.FLOAT_16 else train_dtype
