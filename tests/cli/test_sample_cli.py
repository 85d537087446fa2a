"""scripts/sample.py: a tiny SD 1.5 model rendered with and without a LoRA or an embedding (in-process `main`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file, save_file

from onetrainer.cli.sample import EXIT_FAILED, EXIT_INVALID, EXIT_OK, main
from onetrainer.config import ModelFormat, ModelType, TrainConfig, TrainingMethod
from onetrainer.tiny import tiny_model_dir
from onetrainer.weights.embedding_file import save_embedding
from tests.conftest import ROOT
from tests.helpers import local_config

# 64 px and two steps keep each render well under a second; a high CFG scale makes the prompt's effect visible.
FAST = ["--width", "64", "--height", "64", "--steps", "2", "--cfg-scale", "7", "--device", "cpu"]


@pytest.fixture
def base() -> str:
    return str(tiny_model_dir("sd15"))  # built once per test run (the test session's own cache)


def sample(base: str, *args: str) -> int:
    return main(["--model-type", "STABLE_DIFFUSION_15", "--base-model", base, *FAST, *args])


def pixels(path: Path) -> np.ndarray:
    return np.asarray(Image.open(path).convert("RGB"), dtype=np.int16)


def differ(a: Path, b: Path) -> bool:
    return bool(np.abs(pixels(a) - pixels(b)).max() > 2)


def write_lora(base: str, path: Path) -> None:
    """A kohya LoRA file for the tiny model (UNet and text encoder), with random lora_B so it changes the image."""
    from onetrainer.families import load_family_class
    from onetrainer.methods import create_method

    config = TrainConfig()
    config.model_type = ModelType.STABLE_DIFFUSION_15
    config.base_model_name = base
    config.training_method = TrainingMethod.LORA
    config.lora_rank, config.lora_alpha = 4, 4.0
    config.text_encoder.train = True
    config.output_model_format = ModelFormat.KOHYA_LORA
    family = load_family_class(config.model_type)()
    model = family.load(local_config(config))
    method = create_method(config, family, model, torch.device("cpu"))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for part in ("unet", "text_encoder"):
            for name, param in model.part(part).named_parameters():
                if "lora_B" in name:  # zero at creation: the adapter would have no effect
                    param.copy_(torch.randn(param.shape, generator=generator) * 0.3)
    method.save_output(path)


def test_plain_sampling_writes_the_requested_size_and_seeds_are_reproducible(in_tmp, base, capsys):
    code = sample(base, "--prompt", "a red circle", "--height", "48", "--seed", "5", "--count", "2", "--output", "a")
    assert code == EXIT_OK
    first, second = in_tmp / "a" / "0-a red circle-5.png", in_tmp / "a" / "1-a red circle-6.png"
    assert capsys.readouterr().out.split("\n")[:2] == [str(Path("a") / first.name), str(Path("a") / second.name)]
    assert Image.open(first).size == (64, 48) and Image.open(first).format == "PNG"
    assert differ(first, second)  # another seed, another image

    assert sample(base, "--prompt", "a red circle", "--height", "48", "--seed", "5", "--output", "one.png") == EXIT_OK
    assert capsys.readouterr().out.strip() == "one.png"
    assert not differ(first, in_tmp / "one.png")  # the same seed, the same image


def test_a_lora_file_changes_the_image(in_tmp, base):
    write_lora(base, in_tmp / "lora.safetensors")
    keys = load_file(str(in_tmp / "lora.safetensors"))
    assert any(k.startswith("lora_te_") for k in keys) and any(k.startswith("lora_unet_") for k in keys)

    assert sample(base, "--prompt", "a cat", "--output", "plain.png") == EXIT_OK
    assert sample(base, "--prompt", "a cat", "--lora", "lora.safetensors", "--output", "lora.png") == EXIT_OK
    assert differ(in_tmp / "plain.png", in_tmp / "lora.png")


def test_an_embedding_changes_only_prompts_with_its_placeholder_and_a_config_renders_its_samples(in_tmp, base):
    vectors = torch.randn(2, 32, generator=torch.Generator().manual_seed(1))  # the tiny CLIP's width is 32
    save_embedding(in_tmp / "thing.safetensors", {"emb_params": vectors}, {})
    defaults = {"width": 64, "height": 64, "diffusion_steps": 2, "cfg_scale": 7.0, "seed": 3}
    config = {
        "model_type": "STABLE_DIFFUSION_15",
        "base_model_name": base,
        "samples": [
            {"prompt": "a photo of <thing>", **defaults},
            {"prompt": "a blue square", **defaults},
            {"prompt": "disabled", "enabled": False, **defaults},
        ],
    }
    (in_tmp / "config.json").write_text(json.dumps(config), encoding="utf-8")

    common = ["--config-path", "config.json", "--device", "cpu"]
    assert main([*common, "--output", "plain"]) == EXIT_OK
    assert sorted(p.name for p in (in_tmp / "plain").iterdir()) == ["0-a photo of thing-3.png", "1-a blue square-3.png"]
    args = [*common, "--embedding", "thing.safetensors", "--placeholder", "<thing>", "--output", "emb"]
    assert main(args) == EXIT_OK
    assert differ(in_tmp / "plain" / "0-a photo of thing-3.png", in_tmp / "emb" / "0-a photo of thing-3.png")
    assert not differ(in_tmp / "plain" / "1-a blue square-3.png", in_tmp / "emb" / "1-a blue square-3.png")


def test_embeddings_bundled_in_a_lora_file_are_applied(in_tmp, base):
    write_lora(base, in_tmp / "lora.safetensors")
    state = load_file(str(in_tmp / "lora.safetensors"))
    state["bundle_emb.<thing>.emb_params"] = torch.randn(2, 32, generator=torch.Generator().manual_seed(2)) * 3
    save_file(state, str(in_tmp / "bundled.safetensors"))
    for name, lora in (("plain", "lora.safetensors"), ("bundled", "bundled.safetensors")):
        assert sample(base, "--prompt", "a photo of <thing>", "--lora", lora, "--output", f"{name}.png") == EXIT_OK
    assert differ(in_tmp / "plain.png", in_tmp / "bundled.png")  # the bundled vectors stand for <thing>


def test_a_missing_base_model_fails_with_the_reason(in_tmp, capsys):
    assert sample(str(in_tmp / "nothing.safetensors"), "--prompt", "x", "--output", "x.png") == EXIT_FAILED
    assert f"model not found: {in_tmp / 'nothing.safetensors'}" in capsys.readouterr().err
    assert not (in_tmp / "x.png").exists()


def test_a_model_file_of_another_model_type_fails_with_the_reason(in_tmp, base, capsys):
    from onetrainer.families.sd import StableDiffusionFamily

    config = TrainConfig()
    config.base_model_name = base
    family = StableDiffusionFamily()
    family.save_single_file(family.load(local_config(config)), in_tmp / "sd15.safetensors", torch.float32)

    args = ["--model-type", "STABLE_DIFFUSION_21", "--base-model", "sd15.safetensors", "--prompt", "x"]
    assert main([*args, "--output", "x.png"]) == EXIT_FAILED
    assert "is an SD 1.x checkpoint, which does not fit the model type STABLE_DIFFUSION_21" in capsys.readouterr().err


def _write_unusable(folder: Path) -> None:
    (folder / "damaged.safetensors").write_bytes(b"not a safetensors file")
    name = "lora_unet_no_such_layer"  # a layer the model does not have: a LoRA for another model
    lora = {f"{name}.lora_down.weight": torch.zeros(4, 8), f"{name}.lora_up.weight": torch.zeros(8, 4)}
    save_file({**lora, f"{name}.alpha": torch.ones(())}, str(folder / "other.safetensors"))
    save_embedding(folder / "sd2.safetensors", {"emb_params": torch.zeros(1, 48)}, {})


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--lora", "gone.safetensors"], "LoRA file not found: gone.safetensors"),
        (["--lora", "damaged.safetensors"], "cannot read the LoRA file damaged.safetensors"),
        (["--lora", "other.safetensors"], "1 LoRA modules do not exist in this model, e.g. lora_unet_no_such_layer"),
        (
            ["--embedding", "sd2.safetensors"],
            "its vectors are (1, 48), but the text_encoder of this model needs [tokens, 32]",
        ),
    ],
)
def test_unusable_lora_and_embedding_files_fail_with_the_reason(in_tmp, base, capsys, args, message):
    _write_unusable(in_tmp)
    assert sample(base, "--prompt", "x", *args, "--output", "x.png") == EXIT_FAILED
    assert message in capsys.readouterr().err
    assert not (in_tmp / "x.png").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--prompt", "x", "--output", "x.png"], "give --model-type and --base-model"),
        (["--model-type", "SD9", "--base-model", "m", "--prompt", "x", "--output", "x.png"], "unknown model type"),
        (["--model-type", "STABLE_DIFFUSION_15", "--base-model", "m", "--output", "o"], "give --prompt"),
        (["--preset", "demo", "--count", "2", "--output", "two.png"], "--output must be a folder"),
        (["--preset", "demo", "--width", "60", "--output", "o"], "multiples of 8"),
        (["--preset", "demo", "--placeholder", "<x>", "--output", "o"], "more --placeholder than --embedding"),
        (["--preset", "demo", "--base-image", "a.png", "--mask-image", "m.png", "--output", "o"], "not an inpainting"),
        (["--config-path", "none.json", "--output", "o"], "config file not found"),
    ],
)
def test_bad_arguments_exit_2(in_tmp, capsys, args, message):
    assert main(args) == EXIT_INVALID
    assert message in capsys.readouterr().err


def test_a_family_without_a_module_cannot_be_sampled(in_tmp, capsys, monkeypatch):
    from onetrainer import families

    monkeypatch.delitem(families.FAMILY_CLASSES, "cascade")  # every family of the menu samples today
    args = ["--model-type", "STABLE_CASCADE_1", "--base-model", "m", "--prompt", "x", "--output", "o"]
    assert main(args) == EXIT_INVALID
    assert "cannot be sampled" in capsys.readouterr().err


def test_the_script_runs_as_a_subprocess():
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "sample.py"), "--help"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0 and "--embedding FILE" in result.stdout


def test_pixart_samples_from_the_script(in_tmp):
    args = ["--model-type", "PIXART_ALPHA", "--base-model", "tiny:pixart", *FAST, "--prompt", "a <x> cat"]
    assert main([*args, "--width", "96", "--height", "64", "--output", "wide.png"]) == 0
    assert Image.open(in_tmp / "wide.png").size == (96, 64)


@pytest.mark.parametrize(("variant", "size"), [("wuerstchen", (128, 128)), ("cascade", (128, 256))])
def test_prior_families_sample_through_the_decoder_from_the_script(in_tmp, variant, size):
    model_type = "WUERSTCHEN_2" if variant == "wuerstchen" else "STABLE_CASCADE_1"
    args = ["--model-type", model_type, "--base-model", f"tiny:{variant}", *FAST, "--prompt", "a red circle"]
    assert main([*args, "--width", str(size[0]), "--height", str(size[1]), "--output", "out.png"]) == 0
    assert Image.open(in_tmp / "out.png").size == size


def test_a_depth_model_samples_on_its_base_images_depth(in_tmp):
    """SD 2.0 depth: `--base-image` alone gives the sample its depth map; another image, another picture."""
    rng = np.random.default_rng(0)
    for name in ("a.png", "b.png"):
        Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(in_tmp / name)
    args = ["--model-type", "STABLE_DIFFUSION_20_DEPTH", "--base-model", "tiny:sd20-depth", *FAST, "--prompt", "a room"]
    assert main([*args, "--base-image", "a.png", "--output", "a-out.png"]) == EXIT_OK
    assert main([*args, "--base-image", "b.png", "--output", "b-out.png"]) == EXIT_OK
    assert Image.open(in_tmp / "a-out.png").size == (64, 64)
    assert differ(in_tmp / "a-out.png", in_tmp / "b-out.png")
