"""What a config asks of the processes that train it: how many there are (torchrun's, or what the app launches with
`multi_gpu`: `launcher.py`), the devices the ranks train on, and what the learning-rate and loss scalers multiply by at
that many processes. `distributed.py` is the mechanism and never reads the config; this is where it is read."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from onetrainer.training.device_lists import split_device_names
from onetrainer.training.distributed import RankDevices, device_indexes, world_size_from_environment

if TYPE_CHECKING:
    from onetrainer.config import TrainConfig


def rank_devices(config: TrainConfig) -> RankDevices:
    return RankDevices(config.train_device, config.device_indexes)


def model_split_wanted(config: TrainConfig) -> bool:
    """`multi_gpu` with `multi_gpu_mode` MODEL_SPLIT outside torchrun: one process, the denoiser split over devices."""
    return (
        bool(config.multi_gpu) and config.multi_gpu_mode.value == "MODEL_SPLIT" and world_size_from_environment() <= 1
    )


def split_devices(config: TrainConfig) -> list[torch.device]:
    """MODEL_SPLIT's devices, each with its index (a bare 'cuda' is the current GPU)."""
    out = []
    for name in split_device_names(config):
        device = torch.device(name)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        out.append(device)
    return out


def planned_world_size(config: TrainConfig) -> int:
    """The number of processes a run of `config` uses: torchrun's WORLD_SIZE, or what the app launches."""
    if world_size_from_environment() > 1:
        return world_size_from_environment()
    if model_split_wanted(config):
        return 1
    if config.multi_gpu:
        return len(device_indexes(config.device_indexes)) or max(1, torch.cuda.device_count())
    return 1


def scaler_factor(kind: str, config: TrainConfig, world_size: int = 1) -> float:
    """LR and loss scalers: BATCH scales by the global batch size (per GPU × processes), GRADIENT_ACCUMULATION by
    the accumulation steps."""
    factor = 1.0
    if kind in ("BATCH", "BOTH"):
        factor *= config.batch_size * world_size
    if kind in ("GRADIENT_ACCUMULATION", "BOTH"):
        factor *= config.gradient_accumulation_steps
    return factor


def preflight_text(config: TrainConfig) -> str:
    """The batch per GPU, the global batch and what the LR scaler multiplies by; whether the trained parts are
    sharded."""
    world = planned_world_size(config)
    b = config.batch_size
    scaler = config.learning_rate_scaler.value
    factor = scaler_factor(scaler, config, world)
    lr = f"learning rate × √{factor:g} (learning_rate_scaler {scaler})" if factor != 1 else f"LR scaler {scaler}: none"
    processes = f"{world} processes" if world > 1 else "1 process"
    text = f"batch: {b} per GPU × {processes} = {b * world} global per micro-batch; {lr}"
    if world > 1 and config.multi_gpu_mode.value == "SHARDED":
        text += f"; the trained parts sharded over the {world} processes (FSDP2)"
    if model_split_wanted(config):
        try:
            devices = ", ".join(split_device_names(config)) or "no device"
        except ValueError as error:
            devices = str(error)
        text += f"; the denoiser's blocks split over {devices} (one process)"
    return text
