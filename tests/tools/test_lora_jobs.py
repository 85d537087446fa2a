"""`LoraJob`, what the script and the tools window run: ema orders a run's saves by their steps and weighs them by the
steps, averages any adapter kind, drops the header entries that described one save; a cancelled job writes nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from onetrainer.tools import lora_files as lf
from onetrainer.tools.lora_jobs import JobCancelled, LoraJob
from onetrainer.training.validation import LOSS_METADATA_KEY
from onetrainer.weights.metadata import LORA_TOOL_KEY


def _loha_save(folder: Path, step: int, value: float) -> Path:
    """A LoHa checkpoint as a run's intermediate save names it, every factor filled with `value`."""
    path = folder / f"run-save-{step}-{step // 10}-0.safetensors"
    state = {f"lora_unet_x.hada_w{i}_{s}": torch.full((4, 4), value) for i in (1, 2) for s in "ab"}
    state["lora_unet_x.alpha"] = torch.tensor(4.0)
    save_file(state, str(path), metadata={LOSS_METADATA_KEY: "0.5", "ss_network_dim": "4"})
    return path


def test_ema_over_a_save_folder_follows_the_steps_in_the_names(tmp_path: Path):
    saves = tmp_path / "save"
    saves.mkdir()
    for step, value in ((100, 1.0), (20, 0.0), (60, 0.5)):  # by name: 100 < 20 < 60; by step: 20, 60, 100
        _loha_save(saves, step, value)
    out = tmp_path / "ema.safetensors"
    lines: list[str] = []
    job = LoraJob("ema", out, loras=[str(saves)], sigma_rel=0.2)
    assert job.problems() == []
    assert job.run(lines.append) == [out]
    assert lines == ["steps from the names of the saves: 20, 60, 100"]
    weights = lf.power_ema_weights([20, 60, 100], 0.2)
    expected = weights[0] * 0.0 + weights[1] * 0.5 + weights[2] * 1.0
    averaged = load_file(str(out))
    assert torch.allclose(averaged["lora_unet_x.hada_w1_a"], torch.full((4, 4), expected))
    assert averaged["lora_unet_x.alpha"].item() == 4.0
    with safe_open(str(out), "pt") as f:
        metadata = f.metadata()
    note = json.loads(metadata[LORA_TOOL_KEY])
    assert note["steps"] == [20, 60, 100] and note["weights"] == pytest.approx(weights, abs=1e-6)
    assert LOSS_METADATA_KEY not in metadata and metadata["ss_network_dim"] == "4"  # one save's loss is not the EMA's


def test_names_without_steps_are_taken_in_order_evenly_spaced(tmp_path: Path):
    files = []
    for name, value in (("b", 2.0), ("a", 0.0)):
        path = _loha_save(tmp_path, 10, value).rename(tmp_path / f"{name}.safetensors")
        files.append(str(path))
    lines: list[str] = []
    out = tmp_path / "ema.safetensors"
    LoraJob("ema", out, loras=files, decay=0.5).run(lines.append)
    assert "taken in the given order" in lines[0]
    assert torch.allclose(load_file(str(out))["lora_unet_x.hada_w2_b"], torch.full((4, 4), 1.0))  # 0.5·2 + 0.5·0


def test_a_cancelled_job_writes_nothing(tmp_path: Path):
    generator = torch.Generator().manual_seed(0)
    modules = {f"lora_unet_{i}": lf.LoraModule(torch.randn(4, 8, generator=generator), torch.randn(8, 4), 4.0)
               for i in range(5)}  # fmt: skip
    source = tmp_path / "in.safetensors"
    save_file(lf.write_lora(lf.LoraFile(lf.KOHYA, modules, {}, torch.float32)), str(source))
    seen: list[tuple[str, int, int]] = []

    def progress(what: str, done: int, total: int) -> None:
        seen.append((what, done, total))
        if what == "resize" and done == 3:
            raise JobCancelled

    out = tmp_path / "small.safetensors"
    with pytest.raises(JobCancelled):
        LoraJob("resize", out, loras=[str(source)], rank=2).run(lambda _: None, progress)
    assert seen == [("reading in.safetensors", 0, 1), *(("resize", i, 5) for i in range(4))]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.safetensors"]
