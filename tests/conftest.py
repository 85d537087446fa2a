"""Shared fixtures. Tiny models are built once per test run (see tests/tiny/conftest.py and tests/helpers.py)."""

from __future__ import annotations

import os
from pathlib import Path

# Set before torch loads OpenMP. The suite runs in two processes at once (scripts/test.sh); OpenMP's threads that wait
# for work spin by default, and a test computing with two threads beside the other process then slows down ten times
# (the golden runs: 17 s alone, 190 s beside a busy process, 19 s with passive waiting).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest
import torch

# Every test may name `tiny:` models (many call `run_training` directly), as the entry points make them known: the
# package registers its model source on import (`onetrainer/tiny/source.py`).
import onetrainer.tiny  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]
# torch's own CPU thread count, read before the session changes it (tests/golden runs with it: see there).
DEFAULT_TORCH_THREADS = torch.get_num_threads()


@pytest.fixture(scope="session", autouse=True)
def _training_threads():
    """Tests compute with the torch CPU threads the CLI and the app train with (`training_threads`: all cores but
    one), not torch's default of every core: the tiny models' operations are too small to gain from a second thread,
    and with another process busy on the machine OpenMP's waiting threads spin against it (on 2 cores, a tiny SD 1.5
    LoRA run with a sample took 3 s at one thread and 11 to 16 s at two)."""
    from onetrainer.training.devices import torch_threads, training_threads

    with torch_threads(training_threads()):
        yield


@pytest.fixture
def torch_default_threads():
    """torch's own thread count for a test whose figures were recorded with it, or that compares two computations
    bit for bit: CPU kernels round differently with the thread count (and the tensors' alignment)."""
    from onetrainer.training.devices import torch_threads

    with torch_threads(DEFAULT_TORCH_THREADS):
        yield


@pytest.fixture(autouse=True)
def _isolated_user_dirs(tmp_path_factory, monkeypatch):
    """Keep tests away from the user's cache and app state (tiny models are cached per test run instead)."""
    cache = tmp_path_factory.getbasetemp() / "xdg-cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    monkeypatch.setenv("ONETRAINER_STATE_DIR", str(tmp_path_factory.getbasetemp() / "state"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # huggingface_hub reads its environment once, at import (often before this fixture first runs): never the hub or
    # the user's hub cache, whatever the machine (tests/families/test_hub_models.py makes the hub unreachable instead).
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path_factory.getbasetemp() / "hf-hub"))
    monkeypatch.setenv("HF_HOME", str(tmp_path_factory.getbasetemp() / "hf-home"))
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")


UNREACHABLE_HUB = "http://127.0.0.1:9"  # the discard port: nothing listens, the connection is refused at once


@pytest.fixture
def no_hub(tmp_path, monkeypatch) -> Path:
    """An empty hub cache and an unreachable hub, with offline mode off (as for a user whose connection is down)."""
    from huggingface_hub import constants

    from onetrainer.util import hub

    cache = tmp_path / "hf-hub"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "ENDPOINT", UNREACHABLE_HUB)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hub, "_probes", {})
    return cache


@pytest.fixture
def counted_hub(no_hub, monkeypatch):
    """`no_hub`, with the hub a local endpoint that counts the connections made to it (`tests.helpers.CountingHub`)."""
    from huggingface_hub import constants

    from tests.helpers import CountingHub

    hub = CountingHub()
    monkeypatch.setattr(constants, "ENDPOINT", hub.url)
    yield hub
    hub.close()


@pytest.fixture
def unbuilt_model_type():
    """A OneTrainer model type no family builds, for this test: HUNYUAN_VIDEO with its declaration and family taken out
    of the tables (`tests.helpers.made_unbuilt`; restored afterwards in their order), for the tests of the "not built
    yet" path."""
    from onetrainer.config.enums import ModelType
    from tests.helpers import made_unbuilt

    with made_unbuilt(ModelType.HUNYUAN_VIDEO) as model_type:
        yield model_type


@pytest.fixture
def in_tmp(tmp_path, monkeypatch) -> Path:
    """Run the test with the working directory in a fresh temporary folder (relative paths resolve there)."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def onetrainer_presets_dir() -> Path:
    """OneTrainer's own presets, vendored as test data (tests never read anything outside the clone)."""
    return ROOT / "tests" / "config" / "onetrainer_presets"
