"""scripts/convert_model.py: tiny models and LoRAs converted between layouts reload with the same weights."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from onetrainer.cli.convert_model import build_parser, main
from onetrainer.cli.tool_pass import EXIT_FAILED, EXIT_INVALID, EXIT_OK
from onetrainer.config import ModelType, TrainConfig, TrainingMethod
from onetrainer.tiny import tiny_model_dir
from tests.conftest import ROOT
from tests.helpers import local_config

TYPES = {"sd15": "STABLE_DIFFUSION_15", "sdxl": "STABLE_DIFFUSION_XL_10_BASE"}


def load(variant: str, source: str | Path, lora: str = ""):
    from onetrainer.families import load_family_class
    from onetrainer.methods import create_method

    config = TrainConfig()
    config.model_type = ModelType(TYPES[variant])
    config.base_model_name = str(source)
    family = load_family_class(config.model_type)()
    model = family.load(local_config(config))
    if lora:
        config.training_method = TrainingMethod.LORA
        config.lora_model_name = lora
        for part in ("unet", "text_encoder", "text_encoder_2"):
            if part in model.parts:
                config.part(part).train = False
        create_method(config, family, model, torch.device("cpu"))
    return model


def weights(model) -> dict[str, torch.Tensor]:
    return {f"{p}.{k}": v for p, m in model.parts.items() for k, v in m.state_dict().items()}


def unet_output(model) -> torch.Tensor:
    unet = model.part("unet")
    generator = torch.Generator().manual_seed(0)
    sample = torch.randn(1, unet.config.in_channels, 8, 8, generator=generator)
    hidden = torch.randn(1, 4, unet.config.cross_attention_dim, generator=generator)
    extra = {}
    if unet.config.addition_embed_type == "text_time":
        pooled = model.part("text_encoder_2").config.projection_dim
        extra["added_cond_kwargs"] = {
            "text_embeds": torch.randn(1, pooled, generator=generator),
            "time_ids": torch.zeros(1, 6),
        }
    with torch.no_grad():
        return unet(sample, 10, hidden, **extra).sample


def convert(*args: str) -> int:
    return main([*args])


@pytest.mark.parametrize("variant", ["sd15", "sdxl"])
def test_diffusers_to_single_file_and_back_keeps_every_weight(tmp_path, variant):
    source = tiny_model_dir(variant)
    single = tmp_path / "model.safetensors"
    common = ["--model-type", TYPES[variant], "--output-dtype", "FLOAT_32"]
    assert convert(*common, "--input-name", str(source), "--output-model-format", "ORIGINAL_SINGLE_FILE",
                   "--output-model-destination", str(single)) == EXIT_OK  # fmt: skip
    back = tmp_path / "diffusers"
    assert convert(*common, "--input-name", str(single), "--output-model-format", "DIFFUSERS",
                   "--output-model-destination", str(back)) == EXIT_OK  # fmt: skip
    original = load(variant, source)
    expected = weights(original)
    for converted in (load(variant, single), load(variant, back)):
        got = weights(converted)
        assert got.keys() == expected.keys()
        assert all(torch.equal(got[k], expected[k]) for k in expected)
        assert torch.allclose(unet_output(converted), unet_output(original), atol=1e-5)


def test_output_dtype_is_applied(tmp_path):
    single = tmp_path / "model.safetensors"
    args = ["--model-type", "STABLE_DIFFUSION_15", "--input-name", str(tiny_model_dir("sd15")),
            "--output-model-format", "ORIGINAL_SINGLE_FILE", "--output-model-destination", str(single)]  # fmt: skip
    assert convert(*args) == EXIT_OK  # FLOAT_16 is the default, as in OneTrainer
    dtypes = {v.dtype for v in load_file(str(single)).values() if v.is_floating_point() and v.numel() > 0}
    assert dtypes == {torch.float16}
    # the destination exists now: replaced only when asked
    assert convert(*args, "--output-dtype", "BFLOAT_16") == EXIT_INVALID
    assert convert(*args, "--output-dtype", "BFLOAT_16", "--overwrite") == EXIT_OK
    dtypes = {v.dtype for v in load_file(str(single)).values() if v.is_floating_point() and v.numel() > 0}
    assert dtypes == {torch.bfloat16}


def write_kohya_lora(base: Path, path: Path, variant: str = "sd15") -> None:
    """A kohya LoRA for a tiny model (UNet and text encoders), random up and down weights, alpha != rank."""
    from onetrainer.families import load_family_class
    from onetrainer.methods import create_method

    config = TrainConfig()
    config.model_type = ModelType(TYPES[variant])
    config.base_model_name = str(base)
    config.training_method = TrainingMethod.LORA
    config.lora_rank, config.lora_alpha = 4, 2.0
    config.text_encoder.train = True
    config.text_encoder_2.train = variant == "sdxl"
    family = load_family_class(config.model_type)()
    model = family.load(local_config(config))
    method = create_method(config, family, model, torch.device("cpu"))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for part in method.ranks:
            for name, param in model.part(part).named_parameters():
                if "lora_" in name:
                    param.copy_(torch.randn(param.shape, generator=generator) * 0.1)
    config.output_dtype = config.output_dtype.FLOAT_32
    save_file(method.output_state(), str(path))


def lora_deltas(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """kohya file → the weight change of each module (up @ down × alpha / rank), what the LoRA does."""
    out = {}
    for key in state:
        if key.endswith(".lora_down.weight"):
            name = key[: -len(".lora_down.weight")]
            down, up = state[key].flatten(1), state[f"{name}.lora_up.weight"].flatten(1)
            out[name] = up @ down * (float(state[f"{name}.alpha"]) / down.shape[0])
    return out


@pytest.mark.parametrize("variant", ["sd15", "sdxl"])
def test_lora_kohya_to_diffusers_and_back(tmp_path, variant):
    base = tiny_model_dir(variant)
    kohya = tmp_path / "lora.safetensors"
    write_kohya_lora(base, kohya, variant)
    diffusers_file = tmp_path / "lora-diffusers.safetensors"
    common = ["--model-type", TYPES[variant], "--training-method", "LORA", "--base-model-name", str(base),
              "--output-dtype", "FLOAT_32"]  # fmt: skip
    assert convert(*common, "--input-name", str(kohya), "--output-model-format", "DIFFUSERS_LORA",
                   "--output-model-destination", str(diffusers_file)) == EXIT_OK  # fmt: skip
    keys = load_file(str(diffusers_file)).keys()
    prefixes = ("unet.", "text_encoder.", "text_encoder_2.")
    assert all(k.startswith(prefixes) and ".lora_" in k for k in keys)
    assert variant == "sd15" or any(k.startswith("text_encoder_2.") for k in keys)
    # diffusers' own loader reads it
    from diffusers import StableDiffusionPipeline, StableDiffusionXLPipeline

    pipeline_class = StableDiffusionXLPipeline if variant == "sdxl" else StableDiffusionPipeline
    pipe = pipeline_class.from_pretrained(str(base), **({} if variant == "sdxl" else {"safety_checker": None}))
    pipe.load_lora_weights(str(diffusers_file))

    back = tmp_path / "lora-kohya.safetensors"
    assert convert(*common, "--input-name", str(diffusers_file), "--output-model-format", "KOHYA_LORA",
                   "--output-model-destination", str(back)) == EXIT_OK  # fmt: skip
    original, round_trip = lora_deltas(load_file(str(kohya))), lora_deltas(load_file(str(back)))
    assert original.keys() == round_trip.keys() and original
    assert all(torch.allclose(original[k], round_trip[k], atol=1e-6) for k in original)
    # both reload onto the model with the same outputs
    assert torch.allclose(unet_output(load(variant, base, str(kohya))), unet_output(load(variant, base, str(back))))


def embedding_widths(variant: str) -> dict[str, int]:
    model = load(variant, tiny_model_dir(variant))
    return {slot.embedding_key: slot.encoder.get_input_embeddings().embedding_dim for slot in model.text_encoders}


def test_an_a1111_pt_embedding_converts_to_safetensors(tmp_path):
    width = embedding_widths("sd15")["emb_params"]
    vectors = torch.randn(3, width, generator=torch.Generator().manual_seed(0))
    legacy = tmp_path / "style.pt"
    torch.save({"string_to_param": {"*": vectors}, "name": "style", "step": 500}, legacy)
    out = tmp_path / "style.safetensors"
    args = ["--model-type", "STABLE_DIFFUSION_15", "--training-method", "EMBEDDING", "--base-model-name",
            str(tiny_model_dir("sd15")), "--input-name", str(legacy), "--output-model-format", "SAFETENSORS",
            "--output-model-destination", str(out)]  # fmt: skip
    assert convert(*args) == EXIT_OK
    written = load_file(str(out))
    assert written.keys() == {"emb_params"} and written["emb_params"].dtype == torch.float16
    assert torch.equal(written["emb_params"], vectors.half())


def test_an_sdxl_embedding_converts_dtype_and_a_wrong_one_is_named(tmp_path, capsys):
    widths = embedding_widths("sdxl")
    generator = torch.Generator().manual_seed(1)
    vectors = {key: torch.randn(2, width, generator=generator) for key, width in widths.items()}
    source = tmp_path / "subject.safetensors"
    save_file(vectors, str(source))
    out = tmp_path / "subject-bf16.safetensors"
    args = ["--model-type", TYPES["sdxl"], "--training-method", "EMBEDDING", "--base-model-name",
            str(tiny_model_dir("sdxl")), "--output-model-format", "SAFETENSORS",
            "--output-dtype", "BFLOAT_16"]  # fmt: skip
    assert convert(*args, "--input-name", str(source), "--output-model-destination", str(out)) == EXIT_OK
    written = load_file(str(out))
    assert written.keys() == {"clip_l", "clip_g"}
    assert all(torch.equal(written[k], vectors[k].bfloat16()) for k in vectors)

    wrong = tmp_path / "sd15-embedding.safetensors"
    save_file({"emb_params": torch.zeros(2, 8)}, str(wrong))
    bad_out = tmp_path / "never.safetensors"
    assert convert(*args, "--input-name", str(wrong), "--output-model-destination", str(bad_out)) == EXIT_FAILED
    assert "sd15-embedding.safetensors" in capsys.readouterr().err
    assert not bad_out.exists()


def test_arguments_that_cannot_work(tmp_path, capsys, unbuilt_model_type):
    base = str(tiny_model_dir("sd15"))
    out = str(tmp_path / "out.safetensors")
    cases = [
        (["--model-type", "STABLE_DIFFUSION_15", "--input-name", base, "--output-model-format", "KOHYA_LORA"],
         "not a FINE_TUNE format"),
        (["--model-type", "STABLE_DIFFUSION_15", "--training-method", "LORA", "--input-name", base,
          "--output-model-format", "KOHYA_LORA"], "needs its base model"),
        (["--model-type", unbuilt_model_type.value, "--input-name", base, "--output-model-format", "DIFFUSERS"],
         unbuilt_model_type.value),
        (["--model-type", "SD99", "--input-name", base, "--output-model-format", "DIFFUSERS"], "unknown value"),
    ]  # fmt: skip
    for args, message in cases:
        assert convert(*args, "--output-model-destination", out) == EXIT_INVALID, args
        assert message in capsys.readouterr().err
    missing = str(tmp_path / "missing.safetensors")
    args = ["--model-type", "STABLE_DIFFUSION_15", "--input-name", missing, "--output-model-format", "DIFFUSERS"]
    assert convert(*args, "--output-model-destination", str(tmp_path / "d")) == EXIT_FAILED
    assert "missing.safetensors" in capsys.readouterr().err
    assert not (tmp_path / "d").exists()


def test_readme_shows_the_usage_text():
    assert build_parser().format_help().strip() in (ROOT / "README.md").read_text(encoding="utf-8")


def test_pixart_to_its_original_transformer_and_back(tmp_path):
    from diffusers import PixArtAlphaPipeline

    base = tiny_model_dir("pixart")
    native = tmp_path / "PixArt-tiny.safetensors"
    common = ["--model-type", "PIXART_ALPHA", "--output-dtype", "FLOAT_32"]
    assert convert(*common, "--input-name", str(base), "--output-model-format", "ORIGINAL_TRANSFORMER",
                   "--output-model-destination", str(native)) == EXIT_OK  # fmt: skip
    assert "blocks.0.attn.qkv.weight" in load_file(str(native))
    back = tmp_path / "pixart-diffusers"
    assert convert(*common, "--input-name", str(native), "--base-model-name", str(base), "--output-model-format",
                   "DIFFUSERS", "--output-model-destination", str(back)) == EXIT_OK  # fmt: skip
    original = PixArtAlphaPipeline.from_pretrained(str(base)).transformer.state_dict()
    again = PixArtAlphaPipeline.from_pretrained(str(back)).transformer.state_dict()
    assert again.keys() == original.keys() and all(torch.equal(again[k], original[k]) for k in original)
