"""Per-part settings of fine-tuning, output data types, and real subprocess runs of scripts/train.py."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

from onetrainer.cli.train import main
from onetrainer.training.checkpoint import list_backups, read_progress
from tests.conftest import ROOT
from tests.helpers import assert_samples_are_pictures, image_folder, read_scalars, tiny_config, write_config


def test_finetune_part_learning_rates_and_stop_after(tmp_path):
    image_folder(tmp_path, count=6)
    config = tiny_config(
        tmp_path, method="FINE_TUNE", epochs=1, output_model_format="DIFFUSERS",
        output_model_destination=str(tmp_path / "out" / "model"), learning_rate=1e-4,
        unet={"learning_rate": 2e-4}, text_encoder={"train": True, "learning_rate": 5e-5, "stop_training_after": 1,
                                                    "stop_training_after_unit": "STEP"},
        backup_after=1, backup_after_unit="STEP",
    )  # fmt: skip
    assert main(["--config-path", str(write_config(tmp_path, config))]) == 0
    scalars = read_scalars(tmp_path / "workspace" / "tensorboard")
    assert scalars["lr/unet"][0][1] == pytest.approx(2e-4) and scalars["lr/text_encoder"][0][1] == pytest.approx(5e-5)

    backups = {read_progress(b).global_step: b for b in list_backups(tmp_path / "workspace" / "backup")}
    assert sorted(backups) == [1, 2, 3]

    def weights(step: int, part: str) -> dict:
        return load_file(str(next((backups[step] / "model" / part).glob("*.safetensors"))))

    te1, te3 = weights(1, "text_encoder"), weights(3, "text_encoder")
    assert all(torch.equal(te1[k], te3[k]) for k in te1)  # the text encoder stopped after step 1
    unet1, unet3 = weights(1, "unet"), weights(3, "unet")
    assert any(not torch.equal(unet1[k], unet3[k]) for k in unet1)  # the UNet went on
    assert next((tmp_path / "workspace" / "logs").glob("*.log")).read_text().count("stopped training: text_encoder")


def test_output_dtype_is_applied(tmp_path):
    image_folder(tmp_path)
    config = tiny_config(tmp_path, epochs=1, output_dtype="FLOAT_16")
    assert main(["--config-path", str(write_config(tmp_path, config))]) == 0
    weights = load_file(str(tmp_path / "out" / "lora.safetensors"))
    assert {v.dtype for k, v in weights.items() if not k.endswith(".alpha")} == {torch.float16}


def test_real_subprocess_runs(tmp_path, capsys):
    image_folder(tmp_path)
    config = write_config(tmp_path, tiny_config(tmp_path, epochs=1))
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "train.py"), "--config-path", str(config), "--set", "lora_rank=2"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Finished (completed)" in result.stderr
    assert (
        load_file(str(tmp_path / "out" / "lora.safetensors"))[
            "lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn1_to_q.lora_down.weight"
        ].shape[0]
        == 2
    )

    # A run failing as it loads (the LoRA to continue is not a safetensors file) ends with the failure and the log's
    # path. In process: scripts/train.py exits with main's code, which tests/cli/test_train_failure_output.py checks
    # for a failing run through real processes.
    assert main(["--config-path", str(config), "--set", f"lora_model_name={config}"]) == 1
    failing = capsys.readouterr().err
    assert "Training failed:" in failing and "The log with the full traceback:" in failing


def test_the_demo_preset_as_a_new_user_runs_it(tmp_path):
    """`scripts/train.py --preset demo` from an empty folder: trains, samples and writes a LoRA diffusers loads."""
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "train.py"), "--preset", "demo", "--set", "tensorboard=false"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )  # fmt: skip
    elapsed = time.monotonic() - started
    assert result.returncode == 0, result.stderr[-3000:]
    assert "failed" not in result.stderr, result.stderr[-3000:]  # (the demo is not in test_presets_as_shipped.py)
    print(f"demo preset: {elapsed:.1f} s")  # recorded in docs/benchmarks.md; not a gate
    samples = list((tmp_path / "workspace" / "demo" / "samples").rglob("*.jpg"))
    assert len(samples) == 2
    assert_samples_are_pictures(samples, result.stderr, "demo")
    lora = tmp_path / "models" / "demo-lora.safetensors"
    from diffusers import StableDiffusionPipeline

    from onetrainer.tiny import tiny_model_dir

    pipe = StableDiffusionPipeline.from_pretrained(str(tiny_model_dir("sd15")), safety_checker=None)
    pipe.load_lora_weights(str(lora))
    assert pipe.get_list_adapters()
