"""scripts/train.py: layering, exit codes and problem listing (in-process through `main(argv)`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from onetrainer.cli.train import EXIT_INVALID, build_parser, main
from tests.conftest import ROOT


def test_needs_a_preset_or_a_config(capsys):
    assert main([]) == EXIT_INVALID
    assert "give --config-path, --preset, or both" in capsys.readouterr().err


def test_invalid_config_exits_2_listing_every_problem(in_tmp, capsys):
    (in_tmp / "c.json").write_text(json.dumps({"batch_size": 0, "resolution": "huge", "mystery": 1}))
    code = main(["--config-path", "c.json", "--set", "lora_rank=-1", "--set", "concepts.0.path=missing-folder"])
    err = capsys.readouterr().err
    assert code == EXIT_INVALID
    for path in ("batch_size", "resolution", "lora_rank", "concepts.0.path"):
        assert f"({path}):" in err  # after the words a user knows, the path --set takes
    assert "error: Batch size (batch_size): " in err
    assert "error: concept 'missing-folder' (concepts.0.path): folder not found: missing-folder" in err
    assert "warning: mystery: unknown setting" in err


def test_unreadable_config_exits_2(in_tmp, capsys):
    assert main(["--config-path", "nothing.json"]) == EXIT_INVALID
    assert "config file not found: nothing.json" in capsys.readouterr().err
    (in_tmp / "broken.json").write_text("[1, 2")
    assert main(["--config-path", "broken.json"]) == EXIT_INVALID
    assert "not valid JSON" in capsys.readouterr().err


def test_not_yet_trainable_family_is_refused_clearly(in_tmp, capsys, monkeypatch):
    from onetrainer import families

    monkeypatch.delitem(families.FAMILY_CLASSES, "cascade")  # every family of the menu trains today
    (in_tmp / "images").mkdir()
    code = main(["--preset", "cascade/finetune", "--set", "concepts.0.path=images"])
    assert code == EXIT_INVALID
    assert "cannot be trained yet" in capsys.readouterr().err


def test_readme_shows_the_usage_text():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert build_parser().format_help().strip() in readme


def test_a_real_subprocess_reports_an_invalid_config(in_tmp):
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "train.py"), "--preset", "sd15/lora", "--set", "epochs=0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == EXIT_INVALID
    assert "error: Epochs (epochs): 0 is out of range" in result.stderr


def test_python_dash_m_dispatches(in_tmp):
    result = subprocess.run(
        [sys.executable, "-m", "onetrainer", "train", "--preset", "sd15/lora", "--set", "epochs=0"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert result.returncode == EXIT_INVALID and "epochs" in result.stderr
    result = subprocess.run([sys.executable, "-m", "onetrainer", "--help"], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0 and "create-train-files" in result.stdout


@pytest.mark.parametrize(
    "preset", ["pixart/lora", "pixart/lora-512", "pixart/finetune", "pixart/finetune-512", "pixart/embedding",
               "pixart/embedding-512"],
)  # fmt: skip
def test_pixart_presets_pass_check_on_a_local_model(in_tmp, capsys, preset):
    args = [
        "--check",
        "--preset",
        preset,
        "--set",
        "base_model_name=tiny:pixart",
        "--set",
        "concepts.0.path=tiny:images",
    ]
    assert main(args) == 0, capsys.readouterr().err


def test_onetrainers_pixart_preset_passes_check_on_a_local_model(in_tmp, capsys):
    from tests.conftest import onetrainer_presets_dir

    preset = onetrainer_presets_dir() / "PixArt Alpha" / "#pixart alpha 1.0.json"
    args = ["--check", "--config-path", str(preset), "--set", "base_model_name=tiny:pixart",
            "--set", "concepts.0.path=tiny:images"]  # fmt: skip
    assert main(args) == 0, capsys.readouterr().err


def _check_prior_preset(tmp: Path, preset: str) -> list[str]:
    from onetrainer.tiny.effnet import save_effnet_encoder

    family = preset.split("/")[0]
    effnet = save_effnet_encoder(tmp / "effnet_encoder.safetensors", wuerstchen=family == "wuerstchen")
    return ["--check", "--preset", preset, "--set", f"base_model_name=tiny:{family}",
            "--set", f"decoder.model_name=tiny:{family}-decoder", "--set", f"effnet_encoder.model_name={effnet}",
            "--set", "concepts.0.path=tiny:images"]  # fmt: skip


@pytest.mark.parametrize("method", ["lora", "finetune", "embedding"])
def test_wuerstchen_presets_pass_check_on_local_models(in_tmp, capsys, method):
    assert main(_check_prior_preset(in_tmp, f"wuerstchen/{method}")) == 0, capsys.readouterr().err


@pytest.mark.parametrize("method", ["lora", "finetune", "embedding"])
def test_cascade_presets_pass_check_on_local_models(in_tmp, capsys, method):
    assert main(_check_prior_preset(in_tmp, f"cascade/{method}")) == 0, capsys.readouterr().err


@pytest.mark.parametrize(
    "preset",
    ["Wuerstchen v2/#wuerstchen 2.0.json", "Wuerstchen v2/#wuerstchen 2.0 LoRA.json",
     "Wuerstchen v2/#wuerstchen 2.0 embedding.json", "Stable Cascade/#stable cascade.json"],
)  # fmt: skip
def test_onetrainers_prior_presets_pass_check_on_local_models(in_tmp, capsys, preset):
    from onetrainer.tiny.effnet import save_effnet_encoder
    from tests.conftest import onetrainer_presets_dir

    family = "cascade" if preset.startswith("Stable") else "wuerstchen"
    effnet = save_effnet_encoder(in_tmp / "effnet_encoder.safetensors", wuerstchen=family == "wuerstchen")
    args = ["--check", "--config-path", str(onetrainer_presets_dir() / preset),
            "--set", f"base_model_name=tiny:{family}", "--set", f"decoder.model_name=tiny:{family}-decoder",
            "--set", f"effnet_encoder.model_name={effnet}", "--set", "concepts.0.path=tiny:images"]  # fmt: skip
    assert main(args) == 0, capsys.readouterr().err
