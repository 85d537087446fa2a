"""tiny_model_dir builds a variant once per cache and version, and copes with concurrent builders."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from onetrainer.tiny import TINY_MODEL_VERSION, default_cache_root, storage, tiny_model_dir
from onetrainer.tiny.registry import TinyVariant


@pytest.fixture
def build_count(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []
    original = TinyVariant.build

    def counting_build(self: TinyVariant, seed: int = 0) -> Any:
        calls.append(self.name)
        return original(self, seed)

    monkeypatch.setattr(TinyVariant, "build", counting_build)
    return calls


@pytest.fixture
def progress_bars_on() -> Any:
    """transformers' and diffusers' progress bars shown, as in a process that has not quieted them (the suite has)."""
    import diffusers.utils.logging as diffusers_logging
    import transformers.utils.logging as transformers_logging

    modules = (diffusers_logging, transformers_logging)
    before = [module.is_progress_bar_enabled() for module in modules]
    for module in modules:
        module.enable_progress_bar()
    yield modules
    for module, enabled in zip(modules, before, strict=True):
        (module.enable_progress_bar if enabled else module.disable_progress_bar)()


def test_builds_once_then_reuses(tmp_path: Path, build_count: list[str], progress_bars_on, capsys) -> None:
    first = tiny_model_dir("sd15", cache_root=tmp_path)
    # The first use builds it quietly: no "Writing model shards" bar in the terminal, and bars shown after as before.
    assert "Writing model shards" not in capsys.readouterr().err
    assert all(module.is_progress_bar_enabled() for module in progress_bars_on)
    assert first == tmp_path / "tiny-models" / f"sd15-v{TINY_MODEL_VERSION}"
    assert (first / "model_index.json").is_file()
    stamp = (first / "unet" / "diffusion_pytorch_model.safetensors").stat().st_mtime_ns
    assert tiny_model_dir("sd15", cache_root=tmp_path) == first
    assert build_count == ["sd15"]
    assert (first / "unet" / "diffusion_pytorch_model.safetensors").stat().st_mtime_ns == stamp
    assert sorted(p.name for p in first.parent.iterdir()) == [first.name]


def test_default_cache_root_follows_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_cache_root() == tmp_path / "onetrainer"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert default_cache_root() == Path.home() / ".cache" / "onetrainer"


def test_uses_the_default_root_when_none_is_given(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, saved_tiny_model: Any
) -> None:
    # Seed the default location with a copy of an already built model, so nothing is built here.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    source = saved_tiny_model("sd15")
    shutil.copytree(source, tmp_path / "onetrainer" / "tiny-models" / source.name)
    assert tiny_model_dir("sd15") == tmp_path / "onetrainer" / "tiny-models" / source.name


def test_a_concurrent_builder_that_finishes_first_wins(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    target = tmp_path / "tiny-models" / f"sd15-v{TINY_MODEL_VERSION}"
    real_write = storage.write_pipeline

    def write_while_another_process_finishes(pipeline: Any, folder: Path, variant: TinyVariant, seed: int) -> None:
        real_write(pipeline, folder, variant, seed)
        # Another process renames its finished copy into place while ours is still a temporary folder.
        other = tmp_path / "other"
        shutil.copytree(folder, other)
        (other / storage.MARKER_FILE).write_text(json.dumps({"by": "the other process"}))
        other.rename(target)

    monkeypatch.setattr(storage, "write_pipeline", write_while_another_process_finishes)
    assert tiny_model_dir("sd15", cache_root=tmp_path) == target
    assert json.loads((target / storage.MARKER_FILE).read_text()) == {"by": "the other process"}
    assert sorted(p.name for p in target.parent.iterdir()) == [target.name]  # our copy is gone


def test_a_failed_build_leaves_nothing_behind(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def failing_write(*args: Any, **kwargs: Any) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(storage, "write_pipeline", failing_write)
    with pytest.raises(OSError, match="disk full"):
        tiny_model_dir("sd15", cache_root=tmp_path)
    assert list((tmp_path / "tiny-models").iterdir()) == []
