"""The device lists a config writes (`device_indexes`, `split_devices`) read as devices: the checks, the processes'
plan, the estimate and the trainer read them alike. Config in, names out; nothing here imports the rest of training.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from onetrainer.config import TrainConfig


def device_index_list(text: str) -> list[int]:
    """`device_indexes` ("0,1,3") as GPU numbers, [] when empty; a ValueError saying why for anything else."""
    parts = [part.strip() for part in (text or "").split(",") if part.strip()]
    if not all(part.isdigit() for part in parts):
        raise ValueError(f"{text.strip()!r} is not a comma-separated list of GPU numbers, e.g. '0,1'")
    return [int(part) for part in parts]


def split_device_names(config: TrainConfig) -> list[str]:
    """MODEL_SPLIT's devices as written in `split_devices` ("cuda:0,cuda:1", "cuda:0,cpu"); empty: the GPUs of
    `device_indexes` (every visible GPU when that is empty). A ValueError naming the field for a name torch does not
    read as a device."""
    import torch

    text = (config.split_devices or "").strip()
    if not text:
        try:
            indexes = device_index_list(config.device_indexes)
        except ValueError as error:
            raise ValueError(f"device_indexes: {error}") from None
        if not indexes and torch.cuda.is_available():
            indexes = list(range(torch.cuda.device_count()))
        return [f"cuda:{i}" for i in indexes]
    names = [name.strip() for name in text.split(",")]
    for name in names:
        try:
            torch.device(name)
        except (RuntimeError, ValueError):
            raise ValueError(
                f"split_devices: {name!r} is not a device; list them as 'cuda:0,cuda:1' (or 'cuda:0,cpu')"
            ) from None
    return names
