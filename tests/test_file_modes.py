"""Every file we write gets the modes the user's umask gives new files, so tools running as another user (a ComfyUI in
a container, a shared model folder) can read them: not the owner-only 0600 of temporary files and safetensors."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import torch
from PIL import Image

from onetrainer.config import config_from_dict
from onetrainer.config.io import save_config
from onetrainer.data.cache import DiskCache
from onetrainer.families.sd import StableDiffusionFamily
from onetrainer.methods import create_method
from onetrainer.training.checkpoint import TrainProgress, write_backup
from onetrainer.util.fs import atomic_write_text, current_umask
from tests.helpers import local_config

pytestmark = pytest.mark.skipif(os.name == "nt", reason="Windows files have no POSIX modes")

FAMILY = StableDiffusionFamily()


@pytest.fixture(params=[0o022, 0o002], ids=["umask022", "umask002"])
def umask(request):
    previous = os.umask(request.param)
    yield request.param
    os.umask(previous)


@pytest.fixture(scope="module")
def lora_model():
    config, problems = config_from_dict(
        {
            "base_model_name": "tiny:sd15",
            "train_device": "cpu",
            "training_method": "LORA",
            "lora_rank": 2,
            "output_model_format": "KOHYA_LORA",
        }
    )
    assert [p for p in problems if p.is_error] == []
    model = FAMILY.load(local_config(config))
    return config, model, create_method(config, FAMILY, model, torch.device("cpu"))


def modes(root: Path) -> dict[str, int]:
    """Each file's and folder's permission bits, by path relative to `root` ("." for a single file)."""
    paths = [root, *root.rglob("*")] if root.is_dir() else [root]
    return {str(p.relative_to(root)) if p != root else ".": stat.S_IMODE(p.stat().st_mode) for p in paths}


def assert_umask_modes(root: Path, mask: int) -> None:
    expected = {name: (0o777 if (root / name).is_dir() else 0o666) & ~mask for name in modes(root)}
    assert modes(root) == expected


def test_the_umask_is_read_without_changing_it(umask):
    assert current_umask() == umask
    assert current_umask() == umask


def test_models_have_the_umask_modes(tmp_path, umask, lora_model):
    _, model, method = lora_model
    for written in method.save_output(tmp_path / "lora.safetensors"):
        assert_umask_modes(written, umask)
    FAMILY.save_single_file(model, tmp_path / "finetune.safetensors", torch.float16)
    assert_umask_modes(tmp_path / "finetune.safetensors", umask)
    FAMILY.save_diffusers(model, tmp_path / "diffusers", torch.float16)
    assert_umask_modes(tmp_path / "diffusers", umask)


def test_configs_backups_and_cache_entries_have_the_umask_modes(tmp_path, umask, lora_model):
    config, _, method = lora_model
    save_config(config, tmp_path / "config.json")
    assert_umask_modes(tmp_path / "config.json", umask)

    parameter = torch.nn.Parameter(torch.zeros(2))
    optimizer = torch.optim.SGD([parameter], lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    backup = write_backup(tmp_path / "backup", method, optimizer, scheduler, TrainProgress(), config)
    assert len(modes(backup)) > 3  # the LoRA weights, optimizer, RNG, config and meta files
    assert_umask_modes(backup, umask)

    cache = DiskCache(tmp_path / "cache", "latents")
    cache.put("ab" * 32, {"latent": torch.zeros(4)})
    assert_umask_modes(cache.path("ab" * 32), umask)


def test_masks_and_captions_have_the_umask_modes(tmp_path, umask):
    from gui.mask_editing import MaskDocument

    Image.new("RGB", (16, 16), "white").save(tmp_path / "cat.png")
    document = MaskDocument(tmp_path / "cat.png")
    document.begin_edit()
    document.fill(4, 4, 255)
    mask = document.save()
    assert mask is not None and mask.is_file()
    assert_umask_modes(mask, umask)
    # The dataset tool's caption editor writes through this helper.
    atomic_write_text(tmp_path / "cat.txt", "a cat\n")
    assert_umask_modes(tmp_path / "cat.txt", umask)


def test_a_training_run_writes_nothing_owner_only(tmp_path):
    """Everything a run leaves (model, backup, workspace config, log, samples, cache) has the umask's modes."""
    from onetrainer.training.control import TrainingControl
    from onetrainer.training.events import Finished, ListSink
    from onetrainer.training.runner import run_training
    from tests.helpers import image_folder, tiny_config

    previous = os.umask(0o002)
    try:
        image_folder(tmp_path, count=2)
        data = tiny_config(
            tmp_path,
            epochs=1,
            backup_before_save=True,
            sample_after=1,
            sample_after_unit="EPOCH",
            samples=[{"prompt": "a red circle", "width": 64, "height": 64, "diffusion_steps": 1, "seed": 3}],
        )
        config, problems = config_from_dict(data)
        assert [p for p in problems if p.is_error] == []
        sink = ListSink()
        run_training(config, TrainingControl(), [sink])
        assert sink.of(Finished), sink.events
        written = [tmp_path / "out", tmp_path / "workspace", tmp_path / "cache"]
        assert all(path.is_dir() for path in written)
        for root in written:
            assert_umask_modes(root, 0o002)
    finally:
        os.umask(previous)
