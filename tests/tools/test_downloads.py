"""A tool's first use downloads its model: progress reaches the pass's sinks, Cancel stops the download, and a repo
with safetensors does not download its pickled duplicates. The hub is faked: nothing leaves this machine."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import huggingface_hub
import pytest
from PIL import Image

from onetrainer.tools.downloads import DownloadProgress, hub_snapshot
from onetrainer.tools.folder_pass import PassControl, PassFinished, folder_images, run_pass
from onetrainer.tools.masks import MaskSettings, MaskTask, create_masker
from onetrainer.training.events import ListSink

REPO = "someone/clipseg-copy"


class FakeHub:
    """list_repo_files and snapshot_download: the 'download' counts 10 chunks through the given tqdm class."""

    def __init__(self, folder: Path, chunk_s: float = 0.0, gate: threading.Semaphore | None = None) -> None:
        self.folder, self.chunk_s, self.gate = folder, chunk_s, gate
        self.ignored: list[str] | None = None
        self.downloaded = False

    def install(self, monkeypatch) -> None:
        from huggingface_hub import constants

        from onetrainer.util import hub

        # Online, and the hub answers that the repo exists (the tools ask before downloading, as Start does).
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(hub, "probe", lambda repo_id, timeout=hub.PROBE_TIMEOUT_S: hub.Probe(True))
        monkeypatch.setattr(huggingface_hub.HfApi, "list_repo_files", lambda api, repo, **k: self.files())
        monkeypatch.setattr(huggingface_hub, "snapshot_download", self.snapshot_download)

    def files(self) -> list[str]:
        return [p.name for p in self.folder.iterdir()] + ["pytorch_model.bin"]

    def snapshot_download(self, repo_id, *, ignore_patterns=None, tqdm_class=None, **kwargs) -> str:
        assert repo_id == REPO
        self.ignored = ignore_patterns
        if self.downloaded:  # in the cache now (the processor and the model each ask)
            return str(self.folder)
        with tqdm_class(total=10 * 1024**2, unit="B", desc="model.safetensors") as bar:
            for _ in range(10):
                if self.gate is not None:
                    assert self.gate.acquire(timeout=5)
                time.sleep(self.chunk_s)
                bar.update(1024**2)
        self.downloaded = True
        return str(self.folder)


@pytest.mark.parametrize("terminal_bars", [True, False], ids=["bars", "bars-disabled"])
def test_a_hub_model_downloads_with_progress_then_masks(tmp_path, tiny_tool_model, monkeypatch, request, terminal_bars):
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    request.addfinalizer(disable_progress_bars if are_progress_bars_disabled() else enable_progress_bars)
    (enable_progress_bars if terminal_bars else disable_progress_bars)()  # the window's progress needs neither
    monkeypatch.setattr("onetrainer.tools.downloads._EMIT_EVERY_S", 0.0)
    hub = FakeHub(tiny_tool_model("clipseg"), chunk_s=0.01)
    hub.install(monkeypatch)
    images = tmp_path / "images"
    images.mkdir()
    Image.new("RGB", (40, 30), (200, 20, 20)).save(images / "a.png")
    sink = ListSink()
    masker = create_masker("CLIPSEG", ["a cat"], REPO, device="cpu")
    result = run_pass(MaskTask(masker, MaskSettings(mode="replace")), folder_images(images), [sink])
    assert isinstance(result, PassFinished) and len(result.written) == 1
    progress = [e for e in sink.events if isinstance(e, DownloadProgress)]
    assert progress and progress[-1].done == progress[-1].total == 10 * 1024**2
    assert [e.done for e in progress] == sorted(e.done for e in progress) and progress[0].done < progress[-1].done
    assert progress[-1].what == "model.safetensors" and progress[-1].unit == "B"
    assert "*.bin" in hub.ignored  # the repo has safetensors: its pickled copy is not fetched


def test_cancel_during_the_download_ends_the_pass_as_cancelled(tmp_path, tiny_tool_model, monkeypatch):
    gate = threading.Semaphore(0)
    hub = FakeHub(tiny_tool_model("clipseg"), gate=gate)
    hub.install(monkeypatch)
    images = tmp_path / "images"
    images.mkdir()
    Image.new("RGB", (40, 30), (200, 20, 20)).save(images / "a.png")
    control = PassControl()
    sink = ListSink()
    masker = create_masker("CLIPSEG", ["a cat"], REPO, device="cpu")
    outcome = []
    worker = threading.Thread(
        target=lambda: outcome.append(
            run_pass(MaskTask(masker, MaskSettings()), folder_images(images), [sink], control)
        )
    )
    worker.start()
    gate.release()  # one chunk arrives...
    deadline = time.monotonic() + 120  # a guard against a wait that never ends, not a speed
    while not any(isinstance(e, DownloadProgress) for e in sink.events) and time.monotonic() < deadline:
        time.sleep(0.01)
    control.cancel()  # ...the user cancels, and the next chunk's update stops the download
    gate.release(9)
    worker.join(120)
    assert not worker.is_alive()
    assert isinstance(outcome[0], PassFinished) and outcome[0].cancelled and outcome[0].written == []
    assert not hub.downloaded  # stopped inside the download, not after it
    assert not (images / "a-masklabel.png").exists()
    assert masker.model is None


def test_without_the_hub_the_id_is_left_to_from_pretrained(monkeypatch):
    def unreachable(*args, **kwargs):
        raise OSError("no network")

    monkeypatch.setattr(huggingface_hub.HfApi, "list_repo_files", unreachable)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda *a, **k: pytest.fail("must not download"))
    assert hub_snapshot(REPO) == REPO  # from_pretrained then reads the cache, or says what is missing
