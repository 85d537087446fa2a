"""The small frozen settings the maths of a step take, built once per run from the config.

The noise process (`noise/`) and the gradient reduce (`distributed.py`) never read the config: they take these
objects, which name only what each needs. Building them here, once in the trainer's setup, keeps the config's field
names out of the maths and costs nothing per step. The GUI's timestep preview and the tests build them the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from onetrainer.noise.draws import DrawSettings
from onetrainer.noise.losses import LossSettings
from onetrainer.noise.timesteps import TimestepSettings
from onetrainer.training.distributed import ReduceSettings
from onetrainer.training.sharding import ShardSettings

if TYPE_CHECKING:
    from onetrainer.config import TrainConfig


def timestep_settings(config: TrainConfig) -> TimestepSettings:
    return TimestepSettings(
        distribution=config.timestep_distribution,
        weight=config.noising_weight,
        bias=config.noising_bias,
        shift=config.timestep_shift,
        dynamic_shift=config.dynamic_timestep_shifting,
        min_strength=config.min_noising_strength,
        max_strength=config.max_noising_strength,
    )


def draw_settings(config: TrainConfig) -> DrawSettings:
    return DrawSettings(
        offset_noise_weight=config.offset_noise_weight,
        perturbation_noise_weight=config.perturbation_noise_weight,
    )


def loss_settings(config: TrainConfig) -> LossSettings:
    return LossSettings(
        mse_strength=config.mse_strength,
        mae_strength=config.mae_strength,
        huber_strength=config.huber_strength,
        huber_delta=config.huber_delta,
        log_cosh_strength=config.log_cosh_strength,
    )


def reduce_settings(config: TrainConfig) -> ReduceSettings:
    precision = str(getattr(config.gradient_reduce_precision, "value", config.gradient_reduce_precision))
    return ReduceSettings(
        in_float32=precision.startswith("FLOAT_32"),
        stochastic=precision.endswith("_STOCHASTIC"),
        # buckets of `async_gradient_reduce_buffer` MB; without the fused reduce one parameter at a time
        bucket_bytes=max(1, int(config.async_gradient_reduce_buffer)) * 2**20 if config.fused_gradient_reduce else 0,
        asynchronous=config.async_gradient_reduce,
    )


def shard_settings(config: TrainConfig) -> ShardSettings:
    """A sharded run's numbers (`sharding.py`): float32 weights gathered and computed in a 16-bit train dtype (as
    autocast would compute them), gradients averaged in float32 unless `gradient_reduce_precision` asks for the
    weights' own dtype, the shards in CPU memory with `sharded_cpu_offload`."""
    import torch

    from onetrainer.config.enums import DataType
    from onetrainer.precision.dtypes import torch_dtype

    precision = str(getattr(config.gradient_reduce_precision, "value", config.gradient_reduce_precision))
    sixteen = config.train_dtype in (DataType.BFLOAT_16, DataType.FLOAT_16)
    return ShardSettings(
        compute_dtype=torch_dtype(config.train_dtype) if sixteen else None,
        reduce_dtype=torch.float32 if precision.startswith("FLOAT_32") else None,
        cpu_offload=bool(config.sharded_cpu_offload),
    )


@dataclass(frozen=True)
class StepSettings:
    """Everything a training step's maths takes from the config, in one object the trainer keeps."""

    timesteps: TimestepSettings
    draws: DrawSettings
    losses: LossSettings
    reduce: ReduceSettings

    @classmethod
    def from_config(cls, config: TrainConfig) -> StepSettings:
        return cls(timestep_settings(config), draw_settings(config), loss_settings(config), reduce_settings(config))
