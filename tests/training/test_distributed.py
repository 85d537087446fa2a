"""Several training processes (torchrun, gloo on the CPU): the same weights as one process at the global batch,
outputs written once, resume, a failing rank's message. Each run starts two processes: few, tiny, marked slow."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from onetrainer.config import config_from_dict
from onetrainer.tiny import tiny_model_dir
from onetrainer.training.control import TrainingControl
from onetrainer.training.devices import torch_threads, training_threads
from onetrainer.training.events import Finished
from onetrainer.training.launcher import free_port
from onetrainer.training.runner import run_training
from tests.helpers import image_folder, tiny_config

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("ddp_worker.py")


def _config(root: Path, variant: str = "sd15", **overrides) -> dict:
    image_folder(root, count=4)
    return tiny_config(root, variant, **{"batch_size": 1, "epochs": 2, **overrides})


def _validated(root: Path, config: dict) -> dict:
    """`config` validating 3 images (a VALIDATION concept) each epoch: with two ranks, rank 0 measures 2, rank 1 one."""
    folder = root / "validation"
    folder.mkdir()
    for path in sorted((root / "images").iterdir())[:6]:  # 3 images and their captions
        (folder / path.name).write_bytes(path.read_bytes())
    concept = {"name": "held out", "path": str(folder), "type": "VALIDATION", "seed": 5}
    return {**config, "validation": True, "validate_after": 1, "validate_after_unit": "EPOCH",
            "concepts": [*config["concepts"], concept]}  # fmt: skip


def _validation_losses(root: Path) -> dict[int, float]:
    record = json.loads((root / "workspace" / "validation.json").read_text(encoding="utf-8"))
    return {v["step"]: v["loss"] for v in record["validations"]}


def _torchrun(root: Path, config: dict, env: dict | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
    path = root / "config.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(free_port()),
        str(WORKER),
        "--config-path",
        str(path),
    ]
    environment = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "XDG_CACHE_HOME": str(XDG),
        "HF_HUB_OFFLINE": "1",
        "ONETRAINER_DIST_TIMEOUT": "60",
        **(env or {}),
    }
    return subprocess.run(command, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=timeout)


def _one_process(root: Path, config: dict) -> Finished:
    with torch_threads(training_threads()):  # as the CLI and the app train (torch's default spins on a busy machine)
        outcome = run_training(config_from_dict(config)[0], TrainingControl(), [])
    assert isinstance(outcome, Finished), outcome
    return outcome


def _weights(path: Path) -> dict[str, torch.Tensor]:
    return load_file(str(path))


def _assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    """Equal up to rounding: Adam's first steps divide by tiny second moments, which turns the all-reduce's rounding
    into differences of ~1e-5 on a few entries; a different noise, batch or scale moves weights by ~lr (1e-3)."""
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=2e-4, msg=key)
    difference = sum(float((a[k] - b[k]).float().norm() ** 2) for k in a) ** 0.5
    assert difference < 1e-3 * sum(float(a[k].float().norm() ** 2) for k in a) ** 0.5


XDG = Path()


@pytest.fixture(scope="module", autouse=True)
def _tiny_models(tmp_path_factory):
    """The tiny models, built once here (the ranks only read them), in the cache the session's tests use."""
    global XDG
    XDG = tmp_path_factory.getbasetemp() / "xdg-cache"
    tiny_model_dir("sd15", cache_root=XDG / "onetrainer")


@pytest.fixture(scope="module")
def two_process_run(tmp_path_factory, _tiny_models):
    root = tmp_path_factory.mktemp("ddp-full")
    config = _validated(root, _config(root))
    done = _torchrun(root, config)
    assert done.returncode == 0, done.stdout + done.stderr
    return root, config, done


@pytest.mark.slow
def test_two_processes_at_batch_b_train_what_one_process_trains_at_2b(two_process_run, tmp_path):
    root, _, done = two_process_run
    single = _validated(tmp_path, _config(tmp_path, batch_size=2))
    _one_process(tmp_path, single)
    _assert_same(_weights(root / "out" / "lora.safetensors"), _weights(tmp_path / "out" / "lora.safetensors"))
    # Each rank validated its share of the images; rank 0 reported the mean of all of them.
    ranks, one = _validation_losses(root), _validation_losses(tmp_path)
    assert list(ranks) == list(one) == [2, 4]
    assert list(ranks.values()) == pytest.approx(list(one.values()), rel=1e-4)
    assert (done.stdout + done.stderr).count("validation at epoch") == 2
    # Outputs written once: one run, one config copy, rank 0's console; rank 1 keeps only its own log file.
    logs = sorted(p.name for p in (root / "workspace" / "logs").iterdir())
    assert len(logs) == 2 and sum(name.endswith("-rank1.log") for name in logs) == 1, logs
    assert len(list((root / "workspace" / "config").iterdir())) == 1
    assert len(list((root / "workspace" / "tensorboard").iterdir())) == 1
    assert (done.stdout + done.stderr).count("model saved:") == 1, done.stderr


@pytest.mark.slow
def test_resume_after_a_stop_matches_the_uninterrupted_run(two_process_run, tmp_path):
    root, _, _ = two_process_run
    config = _validated(tmp_path, _config(tmp_path, backup_before_save=True))
    stopped = _torchrun(tmp_path, config, {"DDP_TEST_STOP": "2"})
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert "Finished (stopped)" in stopped.stdout + stopped.stderr
    resumed = _torchrun(tmp_path, {**config, "continue_last_backup": True})
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "resumed from" in resumed.stdout + resumed.stderr
    _assert_same(_weights(root / "out" / "lora.safetensors"), _weights(tmp_path / "out" / "lora.safetensors"))


@pytest.mark.slow
def test_a_nan_on_one_rank_stops_every_rank_with_its_message(tmp_path):
    config = _config(tmp_path)
    done = _torchrun(tmp_path, config, {"DDP_TEST_NAN": "1:1"})
    assert done.returncode != 0
    output = done.stdout + done.stderr
    # Rank 0 heard it at the next step's handshake (waiting out the group's timeout would end with another message).
    assert "rank 1 of 2 failed: NonFiniteLoss: the loss became NaN or infinite at step 2" in output, output
    assert not (tmp_path / "out" / "lora.safetensors").exists()


SDXL_PARTS = ("unet", "text_encoder", "text_encoder_2")


@pytest.mark.slow
def test_an_sdxl_lora_on_two_processes_trains_what_one_process_trains_at_2b(tmp_path_factory):
    tiny_model_dir("sdxl", cache_root=XDG / "onetrainer")
    two, one = tmp_path_factory.mktemp("ddp-sdxl"), tmp_path_factory.mktemp("one-sdxl")
    fast = {"epochs": 1, **{part: {"gradient_checkpointing": False} for part in SDXL_PARTS}}  # no recomputing on a CPU
    done = _torchrun(two, _config(two, "sdxl", **fast))
    assert done.returncode == 0, done.stdout + done.stderr
    _one_process(one, _config(one, "sdxl", batch_size=2, **fast))
    _assert_same(_weights(two / "out" / "lora.safetensors"), _weights(one / "out" / "lora.safetensors"))
    assert (done.stdout + done.stderr).count("model saved:") == 1


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["MUON", "PRODIGY_PLUS_SCHEDULE_FREE"])
def test_the_newer_optimizers_on_two_processes_train_what_one_process_trains_at_2b(tmp_path_factory, optimizer):
    """Muon's split with its auxiliary Adam, and Prodigy + schedule-free's step size D (estimated from the averaged
    gradients each rank holds alike), as data parallel trains them."""
    two, one = tmp_path_factory.mktemp(f"ddp-{optimizer}"), tmp_path_factory.mktemp(f"one-{optimizer}")
    rate = 1.0 if optimizer == "PRODIGY_PLUS_SCHEDULE_FREE" else 1e-3
    settings = {"epochs": 1, "learning_rate": rate, "optimizer": {"optimizer": optimizer}}
    done = _torchrun(two, _config(two, **settings))
    assert done.returncode == 0, done.stdout + done.stderr
    _one_process(one, _config(one, batch_size=2, **settings))
    a, b = _weights(two / "out" / "lora.safetensors"), _weights(one / "out" / "lora.safetensors")
    if optimizer != "MUON":
        _assert_same(a, b)
        return
    # torch's Muon orthogonalises in bfloat16, whose rounding (2^-8) the two runs' last bits reach differently, and it
    # scales a near-zero gradient (an attention's q/k at the first step) up to a direction of its noise: single tensors
    # differ at that level. The up-projections together (zero before training, so all of them is what the steps did)
    # agree to about bfloat16's precision (0.4 % measured), and the whole state as `_assert_same` asks; a missing or
    # doubled step would be tens of percent off.
    up = [k for k in a if k.endswith("lora_up.weight")]
    moved = sum(float((a[k] - b[k]).norm() ** 2) for k in up) ** 0.5
    assert moved < 2e-2 * sum(float(b[k].norm() ** 2) for k in up) ** 0.5
    difference = sum(float((a[k] - b[k]).norm() ** 2) for k in a) ** 0.5
    assert difference < 1e-3 * sum(float(a[k].norm() ** 2) for k in a) ** 0.5
