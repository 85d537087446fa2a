"""`scripts/lora_tool.py extract` on tiny SD 1.5: a "fine-tune" made of the base plus rank-2 changes to a UNet attention
projection, a UNet convolution and a text-encoder attention (and one changed bias, which a LoRA cannot hold) gives back,
at rank 2, a LoRA that diffusers loads onto the base to reproduce the fine-tune's outputs; at rank 1 each layer's kept
share is reported."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from onetrainer.cli.lora_tool import main as lora_tool

CHANGED_UNET = ("down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_q", "mid_block.resnets.0.conv1")
# All four projections of one attention: diffusers tells a kohya text-encoder LoRA's layout by its out projection.
CHANGED_TEXT = tuple(f"encoder.layers.0.self_attn.{p}_proj" for p in ("q", "k", "v", "out"))


@pytest.fixture(scope="module")
def tuned(tmp_path_factory) -> Path:
    from diffusers import UNet2DConditionModel
    from transformers import CLIPTextModel

    from onetrainer.tiny import tiny_model_dir

    folder = tmp_path_factory.mktemp("extract") / "tuned"
    shutil.copytree(tiny_model_dir("sd15"), folder)
    generator = torch.Generator().manual_seed(3)
    unet = UNet2DConditionModel.from_pretrained(str(folder), subfolder="unet")
    text = CLIPTextModel.from_pretrained(str(folder), subfolder="text_encoder")
    layers = [unet.get_submodule(n) for n in CHANGED_UNET] + [text.get_submodule(n) for n in CHANGED_TEXT]
    with torch.no_grad():
        for layer in layers:
            weight = layer.weight.flatten(1)
            change = torch.randn(weight.shape[0], 2, generator=generator) @ torch.randn(
                2, weight.shape[1], generator=generator
            )
            layer.weight += 0.05 * change.reshape(layer.weight.shape)
        unet.conv_in.bias += 0.01  # what a LoRA cannot hold
    unet.save_pretrained(str(folder / "unet"))
    text.save_pretrained(str(folder / "text_encoder"))
    return folder


def _extract(tuned: Path, out: Path, *extra: str) -> int:
    return lora_tool([
        "extract", "--model-type", "STABLE_DIFFUSION_15", "--base-model-name", "tiny:sd15", "--input-name", str(tuned),
        "--output-dtype", "FLOAT_32", "--output-model-destination", str(out), *extra,
    ])  # fmt: skip


def _outputs(pipe) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    latents = torch.randn(1, 4, 8, 8, generator=generator)
    ids = pipe.tokenizer(["a red circle"], padding="max_length", max_length=77, return_tensors="pt").input_ids
    with torch.no_grad():
        text = pipe.text_encoder(ids)[0]
        return text, pipe.unet(latents, torch.tensor([500]), text).sample


def test_an_extracted_lora_on_the_base_gives_the_fine_tunes_outputs(tuned: Path, tmp_path: Path, capsys):
    from diffusers import StableDiffusionPipeline

    from onetrainer.tiny import tiny_model_dir

    out = tmp_path / "extracted.safetensors"
    assert _extract(tuned, out, "--rank", "2") == 0
    report = capsys.readouterr().err
    assert report.count("1.0000 of the change kept") == 6 and "1 changed biases or norms are not in the LoRA" in report
    pipe = StableDiffusionPipeline.from_pretrained(str(tiny_model_dir("sd15")), safety_checker=None)
    pipe.load_lora_weights(str(out))
    tuned_pipe = StableDiffusionPipeline.from_pretrained(str(tuned), safety_checker=None)
    tuned_pipe.unet.conv_in.bias.data = pipe.unet.conv_in.bias.data.clone()  # the one change left out, put back
    (text, unet), (tuned_text, tuned_unet) = _outputs(pipe), _outputs(tuned_pipe)
    assert torch.allclose(text, tuned_text, atol=1e-4) and torch.allclose(unet, tuned_unet, atol=1e-4)

    low = tmp_path / "low.safetensors"
    assert _extract(tuned, low, "--rank", "1", "--output-model-format", "DIFFUSERS_LORA") == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if "of the change kept" in line]
    assert len(lines) == 6 and all("rank 1" in line and "1.0000" not in line for line in lines)
    assert _extract(tuned, low, "--rank", "1") == 2 and "exists; add --overwrite" in capsys.readouterr().err


def test_a_change_within_the_output_dtypes_rounding_is_noise():
    from onetrainer.tools.lora_extract import within_rounding

    generator = torch.Generator().manual_seed(0)
    base = torch.randn(64, 64, generator=generator) * torch.logspace(-6, 2, 64)  # every binade, subnormals for fp16
    base[0, :4] = 0.0
    for dtype in (torch.float16, torch.bfloat16):
        assert within_rounding(base, base.to(dtype).float(), dtype)  # saved in that precision
        moved = base.clone()
        moved[5, 9] = base[5, 9] * (1 + 4 * torch.finfo(dtype).eps)  # one element trained by four steps
        assert not within_rounding(base, moved, dtype)
    normal = base[base.abs() >= 1e-4]  # in float16's normal range: rounded to it, then to bfloat16
    assert within_rounding(normal, normal.half().to(torch.bfloat16).float(), torch.bfloat16)
    assert not within_rounding(base, base.to(torch.bfloat16).float(), torch.float16)  # coarser than the output's


def test_a_half_precision_fine_tune_gives_only_its_trained_layers(tuned: Path, tmp_path: Path, capsys):
    """A fine-tune saved in FLOAT_16 (as a merge writes it by default) differs from its float32 base in every weight by
    rounding: extracted at the default FLOAT_16, the LoRA holds the trained layers only and the rest are counted."""
    from diffusers import UNet2DConditionModel
    from safetensors.torch import load_file
    from transformers import CLIPTextModel

    half = tmp_path / "half"
    shutil.copytree(tuned, half)
    for part, cls in (("unet", UNet2DConditionModel), ("text_encoder", CLIPTextModel)):
        cls.from_pretrained(str(tuned), subfolder=part).half().save_pretrained(str(half / part))
    out = tmp_path / "from-half.safetensors"
    assert lora_tool([
        "extract", "--model-type", "STABLE_DIFFUSION_15", "--base-model-name", "tiny:sd15", "--input-name", str(half),
        "--rank", "2", "--output-model-destination", str(out),
    ]) == 0  # fmt: skip
    report = capsys.readouterr().err
    modules = {k.split(".")[0] for k in load_file(str(out))}
    assert len(modules) == len(CHANGED_UNET) + len(CHANGED_TEXT), sorted(modules)
    assert report.count("of the change kept") == 6
    # Every other Linear and Conv2d of the UNet and the text encoder differs by rounding only.
    unet = UNet2DConditionModel.from_pretrained(str(tuned), subfolder="unet")
    text = CLIPTextModel.from_pretrained(str(tuned), subfolder="text_encoder")
    layers = lambda m: sum(isinstance(x, torch.nn.Linear | torch.nn.Conv2d) for x in m.modules())  # noqa: E731
    noise = (layers(unet) - len(CHANGED_UNET), layers(text) - len(CHANGED_TEXT))
    line = next(line for line in report.splitlines() if "within FLOAT_16's rounding" in line)
    assert line.startswith(f"{sum(noise)} layers left out") and f"(unet: {noise[0]}, text_encoder: {noise[1]})" in line
    assert "changed biases or norms" in report and "1 changed biases" in report  # the rounded biases are noise too
