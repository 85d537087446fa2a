"""The mask and caption tools without a hub: refused after one question to the hub (no download retries) naming the
model and the cache folder (as Start refuses a base model), and Cancel ends a model load without waiting for it.

The hub is made unreachable deterministically (a local endpoint that records each request and drops it; or
HF_HUB_OFFLINE) and the cache is a temporary folder, so nothing leaves this machine and the user's cache is never read.
What the hub was asked is asserted, not how long it took: timings depend on the machine's load.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from huggingface_hub import constants
from PIL import Image

from onetrainer.tools.captions import DEFAULT_MODELS, CaptionTask, create_captioner
from onetrainer.tools.folder_pass import PassFailed, PassFinished, PassThread, folder_images, run_pass
from onetrainer.tools.masks import CLIPSEG_DEFAULT, MaskSettings, MaskTask, create_masker
from onetrainer.util import hub
from tests.conftest import ROOT
from tests.helpers import CountingHub


@pytest.fixture
def images(tmp_path) -> list[Path]:
    folder = tmp_path / "images"
    folder.mkdir()
    Image.new("RGB", (40, 30), (200, 20, 20)).save(folder / "a.png")
    return folder_images(folder)


def _mask_task():
    return MaskTask(create_masker("CLIPSEG", ["a cat"], device="cpu"), MaskSettings())


def _caption_task(name: str):
    return lambda: CaptionTask(create_captioner(name, device="cpu"))


@pytest.mark.parametrize(
    ("make_task", "repo"),
    [
        (_mask_task, CLIPSEG_DEFAULT),
        *[(_caption_task(name), DEFAULT_MODELS[name]) for name in ("BLIP", "BLIP2", "FLORENCE_2", "WD14_VIT_2")],
    ],
    ids=["CLIPSEG", "BLIP", "BLIP2", "FLORENCE_2", "WD14_VIT_2"],
)
def test_an_uncached_tool_model_fails_after_asking_the_hub_once_naming_the_model_and_the_cache(
    no_hub, counted_hub, images, make_task, repo
):
    outcome = run_pass(make_task(), images)
    assert counted_hub.close() == [f"/api/models/{repo}"]  # one question, no download retries (they took minutes)
    assert isinstance(outcome, PassFailed), outcome
    assert f"'{repo}' is not in the local Hugging Face cache ({no_hub})" in outcome.message
    assert f"the hub ({counted_hub.url}) cannot be reached" in outcome.message
    assert "local directory with the same name" not in outcome.message


def test_offline_mode_refuses_without_asking_the_hub(no_hub, images, monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(hub, "probe", lambda *a, **k: pytest.fail("HF_HUB_OFFLINE must not contact the hub"))
    outcome = run_pass(_mask_task(), images)
    assert isinstance(outcome, PassFailed)
    assert f"the ClipSeg model '{CLIPSEG_DEFAULT}' is not in the local Hugging Face cache ({no_hub})" in outcome.message
    assert "HF_HUB_OFFLINE is set" in outcome.message


def test_a_cached_tool_model_loads_from_the_cache_when_the_hub_is_unreachable(
    no_hub, counted_hub, images, tiny_tool_model
):
    from tests.families.test_hub_models import put_in_cache

    put_in_cache(no_hub, CLIPSEG_DEFAULT, tiny_tool_model("clipseg"))
    outcome = run_pass(MaskTask(create_masker("CLIPSEG", ["a cat"], device="cpu"), MaskSettings()), images)
    assert isinstance(outcome, PassFinished) and len(outcome.written) == 1, outcome
    assert counted_hub.close() == [f"/api/models/{CLIPSEG_DEFAULT}"]  # no download retries (they alone took minutes)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("script", "args", "repo", "offline"),
    [
        ("generate_captions.py", ["--model", "FLORENCE_2"], DEFAULT_MODELS["FLORENCE_2"], False),
        ("generate_masks.py", ["--model", "CLIPSEG", "--add-prompt", "cat"], CLIPSEG_DEFAULT, True),
    ],
    ids=["florence2-unreachable", "clipseg-offline"],
)
def test_the_scripts_answer_offline_asking_the_hub_at_most_once(tmp_path, images, script, args, repo, offline):
    hub = CountingHub()
    environment = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_OFFLINE"))},
        "HF_HOME": str(tmp_path / "hf-home"),
        "HF_ENDPOINT": hub.url,
        **({"HF_HUB_OFFLINE": "1"} if offline else {}),
    }
    command = [sys.executable, str(ROOT / "scripts" / script), *args, "--sample-dir", str(images[0].parent)]
    try:
        result = subprocess.run([*command, "--device", "cpu"], capture_output=True, text=True, env=environment)
    finally:
        asked = hub.close()
    assert result.returncode == 1, result.stderr
    assert f"error: the {args[1].replace('CLIPSEG', 'ClipSeg')} model '{repo}'" in result.stderr
    assert f"not in the local Hugging Face cache ({tmp_path / 'hf-home' / 'hub'})" in result.stderr
    # One question when the hub is merely unreachable, none offline: no download retries (they took 167 s for
    # Florence-2, 210 s for ClipSeg).
    assert asked == ([] if offline else [f"/api/models/{repo}"]), asked


class _SlowLoad:
    """A task whose model takes as long as the test wants to load (weights being read, or hub retries)."""

    what = "masks (SLOW)"

    def __init__(self) -> None:
        self.may_finish = threading.Event()
        self.loading = threading.Event()
        self.model = None
        self.released = threading.Event()

    def needs_work(self, image: Path) -> bool:
        return True

    def load(self) -> None:
        self.loading.set()
        assert self.may_finish.wait(300)
        self.model = object()

    def process(self, image: Path) -> Path:
        raise AssertionError("a cancelled load must not process images")

    def release(self) -> None:
        self.model = None
        if self.may_finish.is_set():
            self.released.set()


def test_cancel_ends_a_model_load_at_once_and_the_model_is_released_when_it_arrives(images):
    task = _SlowLoad()
    runner = PassThread()  # as the tool windows run a pass
    runner.start(lambda: task, images)
    assert task.loading.wait(120)
    runner.cancel()
    assert runner.join(120), "Cancel must end the pass while the model still loads"
    assert task.model is None  # the load is still under way: it waits for may_finish, set below
    assert isinstance(runner.outcome, PassFinished) and runner.outcome.cancelled and runner.outcome.written == []
    task.may_finish.set()  # the load finishes later on its own thread: its model is dropped there
    assert task.released.wait(120) and task.model is None


def test_a_load_error_still_fails_the_pass_with_its_message(images):
    from onetrainer.tools.folder_pass import ModelLoadError

    class Broken(_SlowLoad):
        def load(self) -> None:
            raise ModelLoadError("the model 'x' is broken")

    outcome = run_pass(Broken(), images)
    assert isinstance(outcome, PassFailed) and outcome.message == "the model 'x' is broken"
