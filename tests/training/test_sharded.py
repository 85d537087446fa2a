"""Sharded fine-tunes (`multi_gpu_mode` SHARDED, FSDP2) on two processes under torchrun, gloo on the CPU: the same
weights as one process at the global batch, each process holding half of the trained weights and optimizer state,
a sharded backup that resumes exactly, an output that is an ordinary diffusers folder."""

from __future__ import annotations

import json
import os
import re
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
WORKER = Path(__file__).with_name("sharded_worker.py")
VARIANT = "pixart"  # a transformer with declared blocks, and a T5 text encoder (blocks declared too)
PARTS = ("transformer", "text_encoder")
# T5 trains with dropout drawn from each process's own random state, which no number of processes repeats (data
# parallel neither): the runs compared with one process train the transformer alone; one trains T5 too, sharded.
FROZEN_T5 = {"text_encoder": {"train": False}}


def _config(root: Path, **overrides) -> dict:
    image_folder(root, count=4)
    return tiny_config(
        root, VARIANT, method="FINE_TUNE",
        **{"batch_size": 1, "epochs": 2, "output_model_format": "DIFFUSERS", **FROZEN_T5,
           "output_model_destination": str(root / "out" / "model"), "multi_gpu_mode": "SHARDED", **overrides},
    )  # fmt: skip


def _torchrun(root: Path, config: dict, env: dict | None = None) -> subprocess.CompletedProcess:
    path = root / "config.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
               "--master_port", str(free_port()), str(WORKER), "--config-path", str(path)]  # fmt: skip
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "XDG_CACHE_HOME": str(XDG), "HF_HUB_OFFLINE": "1",
                   "ONETRAINER_DIST_TIMEOUT": "60", **(env or {})}  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def _one_process(config: dict) -> None:
    with torch_threads(training_threads()):
        outcome = run_training(config_from_dict(config)[0], TrainingControl(), [])
    assert isinstance(outcome, Finished) and outcome.reason == "completed", outcome


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    """Every part's weights in a diffusers folder, keyed part/name."""
    out = {}
    for part in PARTS:
        (path,) = (folder / part).glob("*.safetensors")
        out |= {f"{part}/{k}": v for k, v in load_file(str(path)).items()}
    return out


def _assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    """As the data-parallel test's: equal up to the rounding of the reduce (Adam's first steps magnify it to ~1e-5),
    where a different noise, batch or scale moves weights by ~lr (1e-3)."""
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=2e-4, msg=key)
    difference = sum(float((a[k] - b[k]).float().norm() ** 2) for k in a) ** 0.5
    assert difference < 1e-3 * sum(float(a[k].float().norm() ** 2) for k in a) ** 0.5


XDG = Path()


@pytest.fixture(scope="module", autouse=True)
def _tiny_models(tmp_path_factory):
    global XDG
    XDG = tmp_path_factory.getbasetemp() / "xdg-cache"
    tiny_model_dir(VARIANT, cache_root=XDG / "onetrainer")


@pytest.fixture(scope="module")
def one_process(tmp_path_factory, _tiny_models):
    """The reference: one process at the global batch (2), unsharded."""
    root = tmp_path_factory.mktemp("one")
    _one_process(_config(root, batch_size=2, multi_gpu_mode="DATA_PARALLEL"))
    return _weights(root / "out" / "model")


@pytest.mark.slow
def test_two_sharded_processes_train_what_one_process_trains_at_2b(one_process, tmp_path):
    sizes = tmp_path / "sizes"
    sizes.mkdir()
    saves = {"save_every": 1, "save_every_unit": "EPOCH"}  # an intermediate save after the first epoch too
    done = _torchrun(
        tmp_path, _config(tmp_path, **saves), {"SHARD_TEST_SIZES": str(sizes), "SHARD_TEST_LOAD": str(sizes)}
    )
    output = done.stdout + done.stderr
    assert re.search(r"transformer sharded over 2 processes as [1-9]\d* blocks and the rest", output), output
    assert "the 2 processes read the model one at a time: this one's turn is 2" in output  # rank 0's, said to the user
    final = _weights(tmp_path / "out" / "model")
    _assert_same(final, one_process)
    assert output.count("model saved:") == 1
    # The intermediate saves after each epoch are ordinary folders too, the last one of the final weights.
    halfway, last = sorted((tmp_path / "workspace" / "save").iterdir(), key=lambda p: "-save-4-" in p.name)
    assert "-save-2-1-0" in halfway.name and (halfway / "model_index.json").is_file()
    assert _weights(last).keys() == final.keys() and all(torch.equal(_weights(last)[k], v) for k, v in final.items())
    earlier = _weights(halfway)
    assert earlier.keys() == final.keys() and any(not torch.equal(earlier[k], final[k]) for k in final)
    # During training each process held about half of the trained weights and of the optimizer's moments.
    ranks = [json.loads((sizes / f"rank{r}.json").read_text(encoding="utf-8")) for r in (0, 1)]
    for kind in ("weights", "optimizer"):
        whole = ranks[0][f"{kind}_whole"]
        assert whole > 0 and ranks[1][f"{kind}_whole"] == whole
        assert sum(r[f"{kind}_local"] for r in ranks) == whole  # every element held once
        for r in ranks:
            assert 0.4 * whole <= r[f"{kind}_local"] <= 0.6 * whole, (kind, ranks)
    assert ranks[0]["optimizer_whole"] == 2 * ranks[0]["weights_whole"]  # AdamW's two moments per weight
    # The processes read the model one at a time, rank 0 last (`sharding.load_in_turns`): rank 1 let go of the
    # transformer's weights before rank 0 began to read, and held none of them until rank 0 sent it its shards, so the
    # two processes together held one whole transformer at a time, not two.
    loads = [json.loads((sizes / f"load-rank{r}.json").read_text(encoding="utf-8")) for r in (0, 1)]
    whole = loads[0]["whole"]
    assert whole >= 2 * ranks[0]["weights_whole"] and loads[1]["whole"] == whole  # float32: 4 bytes a weight
    assert loads[1]["start"] < loads[1]["read"] <= loads[1]["released"][0] < loads[0]["start"] < loads[0]["read"]
    assert loads[1]["after_turns"] == loads[1]["before_shard"] == 0
    assert loads[0]["after_turns"] == loads[0]["before_shard"] == whole
    # The transformer waited in host RAM until sharding moved its shards to the device: never placed there whole.
    for r in ranks:
        assert ["transformer", "device"] not in r["moves"] and ["vae", "device"] in r["moves"], r["moves"]


@pytest.mark.slow
def test_a_trained_text_encoder_is_sharded_too_and_the_output_is_an_ordinary_diffusers_folder(tmp_path):
    """What the sharded run saved loads with diffusers and transformers, unsharded, as plain tensors (T5's tied
    embedding tied again)."""
    from diffusers import PixArtTransformer2DModel
    from transformers import T5EncoderModel

    done = _torchrun(tmp_path, _config(tmp_path, epochs=1, text_encoder={"train": True}))
    output = done.stdout + done.stderr
    assert re.search(r"text_encoder sharded over 2 processes as [1-9]\d* blocks and the rest", output), output
    folder = tmp_path / "out" / "model"
    saved = _weights(folder)
    transformer = PixArtTransformer2DModel.from_pretrained(folder / "transformer")
    encoder = T5EncoderModel.from_pretrained(folder / "text_encoder")
    base = T5EncoderModel.from_pretrained(tiny_model_dir(VARIANT, cache_root=XDG / "onetrainer") / "text_encoder")
    for part, module in (("transformer", transformer), ("text_encoder", encoder)):
        assert all(type(p) is torch.nn.Parameter for p in module.parameters())
        for name, value in module.state_dict().items():
            if f"{part}/{name}" in saved:  # T5's tied embedding is saved once
                torch.testing.assert_close(value, saved[f"{part}/{name}"].to(value.dtype), rtol=0, atol=0)
    assert encoder.shared.weight is encoder.encoder.embed_tokens.weight
    moved = [(a - b).abs().max() for a, b in zip(encoder.parameters(), base.parameters())]
    assert max(moved) > 1e-4  # T5 trained
    assert not any(p.name.startswith(".") for p in (tmp_path / "out").iterdir())  # no temporary left over


@pytest.mark.slow
def test_a_failed_final_save_keeps_the_state_in_a_sharded_backup_that_resumes_exactly_on_one_process_and_two(
    one_process, tmp_path
):
    """Stopped after step 1 or 2, rank 0's write of the model fails (a full disk): every rank hears it and writes its
    shards into a backup, the run ends saying where the trained state is, and no model is left, whole or in part. That
    backup resumes in one process, unsharded, at the global batch (2), which stops after one more step and writes an
    ordinary backup; that one resumes sharded on two processes, which end with the weights of the uninterrupted run:
    the shards of 2 read whole by one process (no process group), one process's backup split over 2."""
    from onetrainer.training.events import Metrics

    config = _config(tmp_path)
    with pytest.raises(AssertionError) as failed:
        _torchrun(tmp_path, config, {"DDP_TEST_STOP": "1", "SHARD_TEST_DISK_FULL": "1"})
    message = str(failed.value)
    assert "the model could not be saved: " in message and "disk full" in message.lower(), message
    (backup,) = (tmp_path / "workspace" / "backup").iterdir()
    assert f"The trained state is in the backup {backup}" in message
    out = tmp_path / "out"
    assert not out.exists() or list(out.iterdir()) == []
    meta = json.loads((backup / "meta.json").read_text(encoding="utf-8"))
    stopped = meta["progress"]["global_step"]  # after the step Stop came in, or the next: the ranks agree on it
    assert meta["sharded"] == {"processes": 2} and stopped in (1, 2)  # of 4 steps
    shards = sorted(p.name for p in (backup / "sharded").iterdir())
    assert shards == [".metadata", "__0_0.distcp", "__1_0.distcp"], shards
    assert not (backup / "model").exists()  # the weights are in the shards, not gathered into one process

    control, statuses = TrainingControl(), []

    class Window:
        def emit(self, event) -> None:
            statuses.append(str(getattr(event, "text", "")))
            if isinstance(event, Metrics) and event.global_step == stopped + 1:
                control.request_stop()

        def close(self) -> None:
            pass

    alone = {**config, "continue_last_backup": True, "batch_size": 2, "multi_gpu_mode": "DATA_PARALLEL",
             "backup_before_save": True, "output_model_destination": str(tmp_path / "alone" / "model")}  # fmt: skip
    with torch_threads(training_threads()):
        outcome = run_training(config_from_dict(alone)[0], control, [Window()])
    assert isinstance(outcome, Finished) and (outcome.reason, outcome.global_step) == ("stopped", stopped + 1), outcome
    assert any(f"resumed from {backup.name}" in s for s in statuses), statuses
    (ordinary,) = [p for p in (tmp_path / "workspace" / "backup").iterdir() if p != backup]
    assert "sharded" not in json.loads((ordinary / "meta.json").read_text(encoding="utf-8"))
    assert (ordinary / "model").is_dir() and not (ordinary / "sharded").exists()

    resumed = _torchrun(tmp_path, {**config, "continue_last_backup": True})
    assert f"resumed from {ordinary.name}: " in resumed.stdout + resumed.stderr
    _assert_same(_weights(tmp_path / "out" / "model"), one_process)


@pytest.mark.slow
def test_shards_written_by_two_ranks_resume_on_three_and_whole_in_one_process(tmp_path):
    """DCP reshards: a backup's shards written by 2 ranks (`ShardedParts.write_state`, blocks of uneven split: 10 and
    3 rows) load on 3 (`ShardedParts.read_state`) with every weight, AdamW moment and EMA average as written, and
    whole into plain parts in this process, with no process group (`read_state_whole`); an unsharded EMA's full
    average splits over 3 ranks as written."""
    from onetrainer.training.ema import EMA
    from onetrainer.training.sharding import read_state_whole
    from tests.training import reshard_worker

    worker = Path(__file__).with_name("reshard_worker.py")
    for mode, ranks in (("write", 2), ("read", 3)):
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(ranks), "--master_addr",
                   "127.0.0.1", "--master_port", str(free_port()), str(worker), mode, str(tmp_path)]  # fmt: skip
        environment = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
        done = subprocess.run(command, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
    written, read = (torch.load(tmp_path / f"{m}.pt", weights_only=True) for m in ("write", "read"))
    assert sorted(p.name for p in (tmp_path / "sharded").iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert written["model"].keys() == read["model"].keys() and len(written["model"]) == 6
    assert all(torch.equal(written["model"][k], read["model"][k]) for k in written["model"])
    assert written["optimizer"]["state"].keys() == read["optimizer"]["state"].keys()
    for name, state in written["optimizer"]["state"].items():
        assert state.keys() == {"step", "exp_avg", "exp_avg_sq"}
        assert all(torch.equal(state[k], read["optimizer"]["state"][name][k]) for k in state)
    assert any(float(v.abs().max()) > 0 for v in written["optimizer"]["state"]["denoiser.0.weight"].values())

    assert len(written["ema"]) == len(read["ema"]) == len(read["split"]) == 6
    for average, again, split, weight in zip(written["ema"], read["ema"], read["split"], written["model"].values()):
        assert torch.equal(average, again) and torch.equal(average, split) and not torch.equal(average, weight)

    plain = reshard_worker.parts()
    params = [p for m in plain.values() for p in m.parameters()]
    optimizer = torch.optim.AdamW(params, lr=1e-2)
    ema = EMA(params, 0.9, 1, torch.device("cpu"))
    read_state_whole(plain, tmp_path / "sharded", optimizer, ema)
    assert all(torch.equal(a, b) for a, b in zip(ema.shadow, written["ema"]))
    named = {f"{part}.{n}": p for part, m in plain.items() for n, p in m.named_parameters()}
    assert all(torch.equal(p, written["model"][n]) for n, p in named.items())
    for name, param in named.items():
        assert all(torch.equal(v, written["optimizer"]["state"][name][k]) for k, v in optimizer.state[param].items())


@pytest.mark.slow
def test_a_rank_killed_before_the_save_ends_the_app_run_with_its_end_and_writes_nothing(tmp_path, monkeypatch):
    """The app's Start (this process rank 0, rank 1 its child): rank 1 killed after the last step, as the gather of
    the weights for the final save begins, ends the run with rank 1's end; no model, whole or in part, is written."""
    from onetrainer.training import launcher
    from onetrainer.training.events import Failed, Metrics

    children = []

    class Recorded(launcher.RankProcess):
        def __init__(self, *args) -> None:
            super().__init__(*args)
            children.append(self)

    monkeypatch.setattr(launcher, "RankProcess", Recorded)
    monkeypatch.setenv("XDG_CACHE_HOME", str(XDG))
    monkeypatch.setenv("ONETRAINER_DIST_TIMEOUT", "60")
    settings = _config(tmp_path, epochs=1, multi_gpu=True, device_indexes="0,1")
    config, problems = config_from_dict(settings)
    assert not [p for p in problems if p.is_error], problems

    class Window:
        def emit(self, event) -> None:
            if isinstance(event, Metrics) and event.global_step == 2:  # the last step: the save comes next
                children[0].process.kill()

        def close(self) -> None:
            pass

    with torch_threads(training_threads()):
        outcome = run_training(config, TrainingControl(), [Window()])
    assert isinstance(outcome, Failed), outcome
    assert outcome.message.startswith("rank 1 of 2 failed: the process ended (killed by SIGKILL)"), outcome.message
    out = tmp_path / "out"
    assert not out.exists() or list(out.iterdir()) == [], list(out.iterdir())


def _averaged_validated_and_sampled(root: Path, config: dict) -> dict:
    """`config` with an EMA (CPU, updated every step; its warm-up keeps the average well apart from the weights),
    validation of 3 images each epoch (2 ranks: one measures 2, the other 1 and a stand-in), a sample each epoch and a
    backup before the save."""
    folder = root / "validation"
    folder.mkdir()
    for path in sorted((root / "images").iterdir())[:6]:  # 3 images and their captions
        (folder / path.name).write_bytes(path.read_bytes())
    held_out = {"name": "held out", "path": str(folder), "type": "VALIDATION", "seed": 5}
    sample = {"prompt": "a red square", "seed": 7, "diffusion_steps": 2, "width": 64, "height": 64, "enabled": True}
    return {**config, "ema": "CPU", "ema_update_step_interval": 1,
            "validation": True, "validate_after": 1, "validate_after_unit": "EPOCH",
            "samples": [sample], "sample_after": 1, "sample_after_unit": "EPOCH", "sample_image_format": "PNG",
            "backup_before_save": True, "concepts": [*config["concepts"], held_out]}  # fmt: skip


def _validation_losses(root: Path) -> dict[int, float]:
    record = json.loads((root / "workspace" / "validation.json").read_text(encoding="utf-8"))
    return {v["step"]: v["loss"] for v in record["validations"]}


def _samples(root: Path) -> dict:
    """Each sample's pixels by its folder (the EMA's, the trained weights') and step."""
    import numpy as np
    from PIL import Image

    paths = (root / "workspace" / "samples").rglob("*.png")
    return {
        (p.parent.name, p.name.split("-training-sample-")[1]): np.asarray(Image.open(p).convert("RGB"), dtype=np.int16)
        for p in paths
    }


@pytest.mark.slow
def test_a_sharded_run_keeps_an_ema_validates_and_samples_as_one_process_does(tmp_path):
    """EMA, validation and samples in a sharded run give what one process gives at the global batch: the final model
    (the average, each process averaging its shard), every validation loss (the rank with fewer images computing a
    stand-in in step with the other), the samples (every process rendering, rank 0 writing). The backup's shards hold
    the average, which one process reads whole: the weights of the final model."""
    from diffusers import PixArtTransformer2DModel

    from onetrainer.training.ema import EMA
    from onetrainer.training.sharding import read_state_whole

    one, two = tmp_path / "one", tmp_path / "two"
    _one_process(_averaged_validated_and_sampled(one, _config(one, batch_size=2, multi_gpu_mode="DATA_PARALLEL")))
    _torchrun(two, _averaged_validated_and_sampled(two, _config(two)))

    final = _weights(two / "out" / "model")
    _assert_same(final, _weights(one / "out" / "model"))
    losses = _validation_losses(two)
    assert losses.keys() == _validation_losses(one).keys() == {2, 4}
    assert losses == pytest.approx(_validation_losses(one), rel=1e-4)
    sharded, alone = _samples(two), _samples(one)
    assert sharded.keys() == alone.keys() and len(sharded) == 4  # after each epoch, the EMA's and the trained weights'
    for key, pixels in sharded.items():
        assert pixels.shape == (64, 64, 3) and int(abs(pixels - alone[key]).max()) <= 2 and pixels.std() > 1, key
    steps = sorted(k for k in sharded if "no-ema" not in k[0])
    assert int(abs(sharded[steps[0]] - sharded[steps[1]]).max()) > 2  # the samples follow the training

    (backup,) = (two / "workspace" / "backup").iterdir()
    transformer = PixArtTransformer2DModel.from_pretrained(
        tiny_model_dir(VARIANT, cache_root=XDG / "onetrainer") / "transformer"
    )
    params = [p for p in transformer.parameters()]
    ema = EMA(params, 0.999, 1, torch.device("cpu"))
    read_state_whole({"transformer": transformer}, backup / "sharded", None, ema)
    names = [n for n, _ in transformer.named_parameters()]
    for name, average, weight in zip(names, ema.shadow, params):
        torch.testing.assert_close(average, final[f"transformer/{name}"].float(), rtol=0, atol=0, msg=name)
        assert not torch.equal(weight, average)  # the backup's weights are the trained ones, apart from the average
