"""The pieces of `training/distributed.py` that need no second process: the preflight's batch line
(`training/processes.py`), the random draws sliced from the global batch, the gradient average's precision and buckets
(a one-process gloo group), and `training/sharding.py`'s loading in turns without a group."""

from __future__ import annotations

import datetime

import pytest
import torch
import torch.distributed as dist

from onetrainer.config import config_from_dict
from onetrainer.training.distributed import Distributed, GlobalDraws, _buckets, stochastic_round
from onetrainer.training.launcher import free_port
from onetrainer.training.processes import preflight_text
from onetrainer.training.settings import reduce_settings


def _config(**values):
    config, problems = config_from_dict(values)
    assert not [p for p in problems if p.is_error], problems
    return config


def test_the_preflight_says_per_gpu_and_global_batch_and_the_lr_scale(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")  # under torchrun
    config = _config(batch_size=2, learning_rate_scaler="BATCH")
    assert preflight_text(config) == (
        "batch: 2 per GPU × 4 processes = 8 global per micro-batch; learning rate × √8 (learning_rate_scaler BATCH)"
    )
    monkeypatch.delenv("WORLD_SIZE")  # the app's multi_gpu: the processes are device_indexes'
    config = _config(batch_size=3, multi_gpu=True, device_indexes="0,1", train_device="cpu")
    assert preflight_text(config).startswith("batch: 3 per GPU × 2 processes = 6 global per micro-batch; LR scaler")
    assert "sharded" not in preflight_text(config)
    sharded = _config(batch_size=3, multi_gpu=True, device_indexes="0,1", train_device="cpu", multi_gpu_mode="SHARDED")
    assert preflight_text(sharded).endswith("; the trained parts sharded over the 2 processes (FSDP2)")


def test_a_model_split_is_one_process_over_its_devices(monkeypatch):
    """MODEL_SPLIT with multi_gpu: the app launches no other process; the devices are split_devices', else the GPUs of
    device_indexes; the preflight names them."""
    from onetrainer.training.launcher import launch_wanted
    from onetrainer.training.processes import planned_world_size, split_device_names, split_devices

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    split = _config(batch_size=2, multi_gpu=True, multi_gpu_mode="MODEL_SPLIT", split_devices="cpu, cpu")
    assert not launch_wanted(split) and planned_world_size(split) == 1
    assert split_devices(split) == [torch.device("cpu"), torch.device("cpu")]
    assert preflight_text(split) == (
        "batch: 2 per GPU × 1 process = 2 global per micro-batch; LR scaler NONE: none; the denoiser's blocks split "
        "over cpu, cpu (one process)"
    )
    indexed = _config(multi_gpu=True, multi_gpu_mode="MODEL_SPLIT", device_indexes="1,0")
    assert split_device_names(indexed) == ["cuda:1", "cuda:0"]
    with pytest.raises(ValueError, match="split_devices: 'gpu:x' is not a device"):
        split_device_names(_config(multi_gpu=True, multi_gpu_mode="MODEL_SPLIT", split_devices="cpu,gpu:x"))
    parallel = _config(multi_gpu=True, device_indexes="0,1", split_devices="cpu,cpu")
    assert launch_wanted(parallel) and planned_world_size(parallel) == 2


def test_each_rank_gets_its_slice_of_the_global_draw():
    generator = torch.Generator().manual_seed(3)
    drawn = torch.randn(GlobalDraws(0, 2).size(3), generator=generator)
    assert drawn.shape == (6,)
    assert torch.equal(torch.cat([GlobalDraws(r, 2).mine(drawn) for r in range(2)]), drawn)


def test_stochastic_rounding_to_bfloat16_is_unbiased():
    value = torch.full((20000,), 1.0 + 2**-9, dtype=torch.float32)  # between bfloat16's 1.0 and 1.0078125
    assert value.to(torch.bfloat16).float().mean() == 1.0  # round to nearest always loses it
    rounded = stochastic_round(value, torch.bfloat16)
    assert rounded.dtype == torch.bfloat16 and set(rounded.float().unique().tolist()) == {1.0, 1.0078125}
    assert rounded.float().mean().item() == pytest.approx(1.0 + 2**-9, abs=2e-4)


def test_buckets_hold_at_most_the_configured_bytes():
    params = [torch.nn.Parameter(torch.zeros(n)) for n in (100, 100, 300, 10)]
    sizes = [[p.numel() for p in bucket] for bucket in _buckets(params, 800, torch.float32)]
    assert sizes == [[100, 100], [300], [10]]
    assert [len(b) for b in _buckets(params, 0, torch.float32)] == [1, 1, 1, 1]  # not fused: one at a time


@pytest.fixture
def one_process_group():
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{free_port()}",
        rank=0,
        world_size=1,
        timeout=datetime.timedelta(seconds=60),
    )
    yield Distributed(0, 1, 0, torch.device("cpu"))
    dist.destroy_process_group()


@pytest.mark.parametrize(
    ("precision", "fused", "asynchronous"),
    [("FLOAT_32_STOCHASTIC", True, True), ("WEIGHT_DTYPE", False, False), ("FLOAT_32", True, False)],
)
def test_averaged_gradients_keep_their_dtype_and_a_missing_one_stays_missing(
    one_process_group, precision, fused, asynchronous
):
    config = _config(
        gradient_reduce_precision=precision, fused_gradient_reduce=fused, async_gradient_reduce=asynchronous
    )
    half = torch.nn.Parameter(torch.zeros(4, dtype=torch.bfloat16))
    full = torch.nn.Parameter(torch.zeros(3))
    unused = torch.nn.Parameter(torch.zeros(2))
    half.grad = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.bfloat16)
    full.grad = torch.tensor([0.5, -1.0, 2.0])
    one_process_group.average_gradients([half, full, unused], reduce_settings(config))
    assert half.grad.dtype == torch.bfloat16 and torch.equal(half.grad.float(), torch.tensor([1.0, 2.0, 3.0, 4.0]))
    assert torch.equal(full.grad, torch.tensor([0.5, -1.0, 2.0]))
    assert unused.grad is None  # an optimizer treats no gradient differently from a zero one


def test_gpus_use_nccl_where_torch_has_it_and_gloo_elsewhere(monkeypatch):
    import torch.distributed as dist

    from onetrainer.training.distributed import collective_backend

    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    assert (collective_backend(True), collective_backend(False)) == ("nccl", "gloo")
    monkeypatch.setattr(dist, "is_nccl_available", lambda: False)  # torch's Windows builds
    assert collective_backend(True) == "gloo"


@pytest.mark.parametrize(
    ("train_dtype", "reduce", "compute", "reduced"),
    [
        ("FLOAT_32", "FLOAT_32_STOCHASTIC", None, torch.float32),
        ("BFLOAT_16", "FLOAT_32", torch.bfloat16, torch.float32),
        ("FLOAT_16", "WEIGHT_DTYPE", torch.float16, None),
    ],
)
def test_a_sharded_run_gathers_in_a_16_bit_train_dtype_and_reduces_as_gradient_reduce_precision_says(
    train_dtype, reduce, compute, reduced
):
    """`shard_settings`: float32 weights are gathered in a 16-bit train dtype (the one autocast computes them in),
    never narrowed for a FLOAT_32 run; gradients averaged in float32 unless the weights' own dtype is asked for."""
    from onetrainer.training.settings import shard_settings

    config, _ = config_from_dict(
        {"train_dtype": train_dtype, "gradient_reduce_precision": reduce, "sharded_cpu_offload": True}
    )
    settings = shard_settings(config)
    assert (settings.compute_dtype, settings.reduce_dtype, settings.cpu_offload) == (compute, reduced, True)


def test_a_rank_ends_with_its_code_and_its_output_flushed_without_the_interpreters_teardown(tmp_path):
    """`end_worker_process`: what was printed (unflushed) and logged reaches its streams, the exit code is the run's,
    and nothing of the interpreter's teardown runs (an atexit handler stands for it)."""
    import subprocess
    import sys

    script = (
        "import atexit, logging, sys\n"
        "from onetrainer.training.distributed import end_worker_process\n"
        f"logging.basicConfig(filename={str(tmp_path / 'run.log')!r}, level=logging.INFO)\n"
        "atexit.register(lambda: print('teardown ran', flush=True))\n"
        "logging.getLogger('onetrainer').info('logged line')\n"
        "print('printed line', end='')\n"
        "print('stderr line', end='', file=sys.stderr)\n"
        "end_worker_process(3)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 3
    assert done.stdout == "printed line" and done.stderr == "stderr line"
    assert "logged line" in (tmp_path / "run.log").read_text(encoding="utf-8")


def test_a_part_without_its_weights_keeps_its_modules_buffers_ties_and_what_trains():
    """`sharding.without_weights`: every parameter empty on the meta device, of its shape and dtype, wanting a gradient
    as it did, a tied one still one parameter; the modules (and what was set on them) and the buffers kept; the
    weights themselves let go."""
    import gc
    import weakref

    from onetrainer.training.sharding import without_weights

    part = torch.nn.Sequential(torch.nn.Embedding(7, 4), torch.nn.Linear(4, 7, bias=False), torch.nn.LayerNorm(7))
    part[1].weight = part[0].weight  # tied, as T5's embedding and its head
    part[2].bias.requires_grad_(False)
    part.register_buffer("freqs", torch.arange(3.0), persistent=False)
    part[1].note = "set on the module"
    modules, shapes = list(part.modules()), {n: (p.shape, p.dtype) for n, p in part.named_parameters()}
    held = weakref.ref(part[0].weight)
    without_weights(part)
    gc.collect()
    assert held() is None  # nothing holds the weights any more
    assert list(part.modules()) == modules and part[1].note == "set on the module"
    assert all(p.is_meta for p in part.parameters()) and len(list(part.parameters())) == 3  # the tie counted once
    assert {n: (p.shape, p.dtype) for n, p in part.named_parameters()} == shapes
    assert part[1].weight is part[0].weight
    assert [p.requires_grad for p in part.parameters()] == [True, True, False]
    assert not part.freqs.is_meta and torch.equal(part.freqs, torch.arange(3.0))


@pytest.mark.parametrize("rank", [0, 1, 2])
def test_the_processes_load_one_at_a_time_rank_0_last_the_others_without_the_sharded_weights(rank):
    """`sharding.load_in_turns`, as each of 3 processes sees it: the turns go 1, 2, 0, with a barrier after each (so
    the next reads only once the one before let go); a rank other than 0 keeps the parts to shard without weights,
    and the others (frozen) whole; rank 0 keeps everything."""
    from types import SimpleNamespace

    from onetrainer.training.sharding import load_in_turns

    events = []
    group = SimpleNamespace(rank=rank, world_size=3, is_main=rank == 0, barrier=lambda: events.append("barrier"))

    def load():
        events.append("load")
        parts = {"transformer": torch.nn.Linear(4, 4), "vae": torch.nn.Linear(4, 4)}
        return SimpleNamespace(parts=parts, part=parts.__getitem__)

    model = load_in_turns(group, load, lambda m: ["transformer"])
    turn = [1, 2, 0].index(rank)
    assert events == ["barrier"] * turn + ["load"] + ["barrier"] * (3 - turn)
    assert all(p.is_meta for p in model.part("transformer").parameters()) == (rank != 0)
    assert not any(p.is_meta for p in model.part("vae").parameters())
