"""`multi_gpu` and `device_indexes` (OneTrainer's names) are real settings now: checked on Start and --check."""

from __future__ import annotations

import pytest

from onetrainer.config import TrainConfig, config_from_dict
from onetrainer.training.checks import check_devices

MULTI_GPU_SETTINGS = (
    "multi_gpu",
    "device_indexes",
    "gradient_reduce_precision",
    "fused_gradient_reduce",
    "async_gradient_reduce",
    "async_gradient_reduce_buffer",
)


def _config(**values) -> TrainConfig:
    config, problems = config_from_dict({"train_device": "cpu", "multi_gpu": True, **values})
    assert problems == [], problems
    return config


def test_the_multi_gpu_settings_are_no_longer_ignored():
    specs = {spec.name: spec for spec in TrainConfig.specs()}
    assert not any(specs[name].meta.ignored for name in MULTI_GPU_SETTINGS)
    _, problems = config_from_dict({"multi_gpu": True, "device_indexes": "0,1", "async_gradient_reduce": False})
    assert problems == []  # no "ignored" warning


@pytest.mark.parametrize(
    ("indexes", "words"),
    [
        ("", "multi_gpu needs 2 devices or more and this machine has 0 CUDA devices"),
        ("0", "device_indexes lists 1 ('0')"),
        ("0,x", "'0,x' is not a comma-separated list of GPU numbers"),
        ("1,1", "'1,1' names a GPU twice"),
    ],
)
def test_multi_gpu_with_fewer_than_two_devices_names_device_indexes(monkeypatch, indexes, words):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    (problem,) = check_devices(_config(device_indexes=indexes))
    assert problem.path == "device_indexes" and problem.is_error
    assert words in problem.message


def test_two_cpu_processes_or_torchrun_pass(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert check_devices(_config(device_indexes="0,1")) == []
    assert check_devices(_config(multi_gpu=False, device_indexes="0")) == []
    monkeypatch.setenv("WORLD_SIZE", "2")  # under torchrun the processes are torchrun's
    assert check_devices(_config(device_indexes="")) == []


def test_a_bad_gradient_reduce_precision_is_refused():
    _, problems = config_from_dict({"gradient_reduce_precision": "FLOAT_64"})
    assert [p.path for p in problems] == ["gradient_reduce_precision"]
