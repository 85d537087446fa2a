"""`scripts/lora_tool.py` on a LoRA trained on tiny SD 1.5 (kohya's layout), each output loaded with diffusers'
`load_lora_weights`: resizing to the LoRA's own rank changes nothing, to a lower rank something; merging the LoRA
with itself at halves, and averaging two copies of it, give it back; the output's metadata says what made it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from onetrainer.cli.lora_tool import main
from onetrainer.weights.metadata import LORA_TOOL_KEY
from tests.helpers import image_folder, tiny_config, write_config


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    from onetrainer.cli.train import main as train

    root = tmp_path_factory.mktemp("lora-tool")
    image_folder(root)
    config = tiny_config(root, epochs=1, learning_rate=1e-2, text_encoder={"train": False})
    assert train(["--config-path", str(write_config(root, config))]) == 0
    return root / "out" / "lora.safetensors"


@pytest.fixture(scope="module")
def pipe():
    from diffusers import DDIMScheduler, StableDiffusionPipeline

    from onetrainer.tiny import tiny_model_dir

    pipe = StableDiffusionPipeline.from_pretrained(str(tiny_model_dir("sd15")), safety_checker=None)
    pipe.scheduler = DDIMScheduler.from_config(pipe.scheduler.config)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _latents(pipe, lora: Path | None) -> torch.Tensor:
    if lora is not None:
        pipe.load_lora_weights(str(lora))
    try:
        with torch.no_grad():
            return pipe(
                "a red circle", height=64, width=64, num_inference_steps=2, guidance_scale=3.0,
                generator=torch.Generator().manual_seed(0), output_type="latent",
            ).images  # fmt: skip
    finally:
        if lora is not None:
            pipe.unload_lora_weights()


def test_each_command_writes_a_lora_diffusers_loads(trained: Path, pipe, tmp_path: Path, capsys):
    base, original = _latents(pipe, None), _latents(pipe, trained)
    assert not torch.allclose(base, original, atol=1e-4)
    out = {name: tmp_path / f"{name}.safetensors" for name in ("same", "low", "merged", "ema")}
    assert main(["resize", "--lora", str(trained), "--rank", "4", "--output-model-destination", str(out["same"])]) == 0
    assert main(["resize", "--lora", str(trained), "--rank", "1", "--output-model-destination", str(out["low"])]) == 0
    report = capsys.readouterr().err
    assert "rank 4 → 1" in report and "of the change kept" in report
    merge = ["merge-loras", "--lora", str(trained), "--lora", str(trained), "--strength", "0.5", "--strength", "0.5"]
    assert main([*merge, "--output-model-destination", str(out["merged"])]) == 0
    assert "of the change kept" not in capsys.readouterr().err  # exact: nothing lost
    at_rank = tmp_path / "merged-r1.safetensors"
    assert main([*merge, "--rank", "1", "--output-model-destination", str(at_rank)]) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if "of the change kept" in line]
    assert lines and all("rank 8 → 1" in line for line in lines)  # the two rank-4 copies side by side, at rank 1
    with safe_open(str(at_rank), "pt") as f:
        least = json.loads(f.metadata()[LORA_TOOL_KEY])["least_kept_energy"]
    shares = [float(line.split(", ")[-1].split()[0]) for line in lines]  # "…, 0.9731 of the change kept"
    assert least == pytest.approx(min(shares), abs=1e-4) and 0 < least <= 1
    ema = ["ema", "--lora", str(trained), "--lora", str(trained), "--decay", "0.9"]
    assert main([*ema, "--output-model-destination", str(out["ema"])]) == 0
    for name in ("same", "merged", "ema"):
        assert torch.allclose(_latents(pipe, out[name]), original, atol=1e-4), name
    low = _latents(pipe, out["low"])
    assert not torch.allclose(low, original, atol=1e-5) and not torch.allclose(low, base, atol=1e-5)
    with safe_open(str(out["low"]), "pt") as f:
        metadata = f.metadata()
    assert json.loads(metadata[LORA_TOOL_KEY])["command"] == "resize" and metadata["ss_network_dim"] == "1"
    assert metadata["ss_network_alpha"] == "0.5"  # alpha 2 at rank 4: the same strength at rank 1


def test_bad_arguments_are_refused_before_anything_is_read(trained: Path, tmp_path: Path, capsys):
    existing = tmp_path / "existing.safetensors"
    existing.write_bytes(b"keep me")
    cases = [
        (["resize", "--lora", str(trained), "--output-model-destination", str(tmp_path / "a.safetensors")],
         "resize takes --rank or --energy"),
        (["resize", "--lora", str(trained), "--rank", "2", "--output-model-destination", str(existing)],
         "exists; add --overwrite"),
        (["ema", "--lora", str(trained), "--decay", "0.9",
          "--output-model-destination", str(tmp_path / "b.safetensors")], "ema takes at least 2 LoRA files"),
        (["merge-loras", "--lora", str(tmp_path / "missing.safetensors"),
          "--output-model-destination", str(tmp_path / "c.safetensors")], "not a .safetensors file"),
        # A Flux file holds the transformer alone: the advice names this script's option, not the config's field.
        (["extract", "--model-type", "FLUX_DEV_1", "--base-model-name", str(trained), "--input-name", str(trained),
          "--rank", "2", "--output-model-destination", str(tmp_path / "d.safetensors")],
         f"--base-model-name {trained} is a single file, which for Flux.1 holds the transformer alone: give a "
         f"diffusers Flux.1 folder or hub id as --base-model-name and this file as --transformer-model-name"),
        (["merge", "--model-type", "STABLE_DIFFUSION_15", "--base-model-name", "tiny:sd15", "--lora", str(trained),
          "--transformer-model-name", str(trained), "--output-model-format", "DIFFUSERS",
          "--output-model-destination", str(tmp_path / "e")],
         "--transformer-model-name: Stable Diffusion 1.5 / 2.x reads no transformer from a file of its own"),
    ]  # fmt: skip
    for argv, message in cases:
        assert main(argv) == 2
        assert message in capsys.readouterr().err
    assert existing.read_bytes() == b"keep me"


def test_readme_shows_the_usage_text():
    from onetrainer.cli.lora_tool import build_parser

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    assert build_parser().format_help().strip() in readme
