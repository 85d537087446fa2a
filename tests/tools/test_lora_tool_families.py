"""`scripts/lora_tool.py extract` and `merge` on tiny SDXL and Flux (SD 1.5 is in test_lora_extract / test_lora_merge):
a "fine-tune" made of the base plus rank-2 changes to attention and MLP projections (SDXL: a convolution and the
second text encoder too; Flux: every projection that kohya's layout fuses) gives back, at rank 2, a kohya LoRA that
diffusers loads onto the base to reproduce the fine-tune; merged back into the base, that LoRA gives a model whose
outputs are the base's with the LoRA applied by diffusers. A Flux merge written as the transformer alone, in FLOAT_16,
extracts again into the same layers."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from onetrainer.cli.lora_tool import main as lora_tool
from onetrainer.tiny import tiny_model_dir
from onetrainer.tiny.denoiser_step import denoiser_inputs, prediction
from tests.helpers import VARIANT_MODEL_TYPES

QKV = ("to_q", "to_k", "to_v")
CASES = {
    "sdxl": {
        "pipeline": "StableDiffusionXLPipeline",
        "denoiser": ("unet", "UNet2DConditionModel"),
        "changed": [f"down_blocks.1.attentions.0.transformer_blocks.0.attn1.{p}" for p in QKV]
        + ["down_blocks.0.resnets.0.conv1"],
        # All four projections of one attention: diffusers tells a kohya text-encoder LoRA's layout by its out one.
        "text": ("text_encoder_2", "CLIPTextModelWithProjection",
                 [f"text_model.encoder.layers.0.self_attn.{p}_proj" for p in ("q", "k", "v", "out")]),
    },
    "flux-dev": {
        "pipeline": "FluxPipeline",
        "denoiser": ("transformer", "FluxTransformer2DModel"),
        "changed": [f"transformer_blocks.0.attn.{p}" for p in QKV]
        + [f"transformer_blocks.0.attn.add_{p}_proj" for p in "qkv"]
        + [f"single_transformer_blocks.0.attn.{p}" for p in QKV] + ["single_transformer_blocks.0.proj_mlp"],
        "text": None,
    },
}  # fmt: skip


def _class(library: str, name: str):
    import importlib

    return getattr(importlib.import_module(library), name)


def _change(module: torch.nn.Module, names: list[str], generator: torch.Generator) -> None:
    with torch.no_grad():
        for name in names:
            layer = module.get_submodule(name)
            weight = layer.weight.flatten(1)
            change = torch.randn(weight.shape[0], 2, generator=generator) @ torch.randn(
                2, weight.shape[1], generator=generator
            )
            layer.weight += 0.05 * change.reshape(layer.weight.shape)


@pytest.fixture(scope="module", params=sorted(CASES))
def extracted(request, tmp_path_factory):
    """(variant, the tuned folder, the LoRA extracted from it at rank 2)."""
    variant, case = request.param, CASES[request.param]
    root = tmp_path_factory.mktemp(f"lora-tool-{variant}")
    tuned = root / "tuned"
    shutil.copytree(tiny_model_dir(variant), tuned)
    generator = torch.Generator().manual_seed(5)
    part, cls = case["denoiser"]
    denoiser = _class("diffusers", cls).from_pretrained(str(tuned), subfolder=part)
    _change(denoiser, case["changed"], generator)
    denoiser.save_pretrained(str(tuned / part))
    if case["text"]:
        part, cls, names = case["text"]
        encoder = _class("transformers", cls).from_pretrained(str(tuned), subfolder=part)
        _change(encoder, names, generator)
        encoder.save_pretrained(str(tuned / part))
    lora = root / "extracted.safetensors"
    assert lora_tool([
        "extract", "--model-type", VARIANT_MODEL_TYPES[variant], "--base-model-name", f"tiny:{variant}",
        "--input-name", str(tuned), "--rank", "2", "--output-dtype", "FLOAT_32",
        "--output-model-destination", str(lora),
    ]) == 0  # fmt: skip
    return variant, tuned, lora


def _outputs(pipe, variant: str) -> list[torch.Tensor]:
    case = CASES[variant]
    model = getattr(pipe, case["denoiser"][0])
    with torch.no_grad():
        out = [prediction(model(**denoiser_inputs(model)))]
        if case["text"]:
            encoder = getattr(pipe, case["text"][0])
            ids = pipe.tokenizer_2(["a red circle"], padding="max_length", max_length=77, return_tensors="pt")
            out.append(encoder(ids.input_ids, output_hidden_states=True).hidden_states[-2])
    return out


def _pipe(variant: str, folder: Path, lora: Path | None = None, monkeypatch=None):
    pipe = _class("diffusers", CASES[variant]["pipeline"]).from_pretrained(str(folder))
    if lora is not None:
        if variant.startswith("flux"):  # diffusers' kohya converter hard-codes Flux.1's widths: the tiny one's instead
            from diffusers.loaders import lora_pipeline

            from tests.weights.flux_models import kohya_lora_converter

            converter = kohya_lora_converter(dict(pipe.transformer.config))
            monkeypatch.setattr(lora_pipeline, "_convert_kohya_flux_lora_to_diffusers", converter)
        pipe.load_lora_weights(str(lora))
    return pipe


def test_an_extracted_lora_on_the_base_gives_the_fine_tunes_outputs(extracted, monkeypatch):
    variant, tuned, lora = extracted
    with_lora = _outputs(_pipe(variant, tiny_model_dir(variant), lora, monkeypatch), variant)
    for got, expected in zip(with_lora, _outputs(_pipe(variant, tuned), variant)):
        assert torch.allclose(got, expected, atol=1e-4), (got - expected).abs().max()


def test_the_lora_merged_into_the_base_is_the_base_with_the_lora_applied(extracted, tmp_path, monkeypatch):
    variant, _, lora = extracted
    merged = tmp_path / "merged"
    assert lora_tool([
        "merge", "--model-type", VARIANT_MODEL_TYPES[variant], "--base-model-name", f"tiny:{variant}",
        "--lora", str(lora), "--output-model-format", "DIFFUSERS", "--output-dtype", "FLOAT_32",
        "--output-model-destination", str(merged),
    ]) == 0  # fmt: skip
    base = _outputs(_pipe(variant, tiny_model_dir(variant)), variant)
    expected = _outputs(_pipe(variant, tiny_model_dir(variant), lora, monkeypatch), variant)
    for got, want, before in zip(_outputs(_pipe(variant, merged), variant), expected, base):
        assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()
        assert not torch.allclose(got, before, atol=1e-4)  # the LoRA changed something


@pytest.mark.parametrize("extracted", ["flux-dev"], indirect=True)
def test_a_merge_written_as_the_transformer_alone_extracts_the_trained_layers_again(extracted, tmp_path, capsys):
    """The merge at its default FLOAT_16 rounds every weight of the transformer: extracted again at FLOAT_16, only the
    trained layers come back; the rest differ by rounding and are counted."""
    from safetensors.torch import load_file

    variant, _, lora = extracted
    merged = tmp_path / "merged.safetensors"
    base = ["--model-type", VARIANT_MODEL_TYPES[variant], "--base-model-name", f"tiny:{variant}"]
    assert lora_tool([
        "merge", *base, "--lora", str(lora), "--output-model-format", "ORIGINAL_TRANSFORMER",
        "--output-model-destination", str(merged),
    ]) == 0  # fmt: skip
    again = tmp_path / "again.safetensors"
    capsys.readouterr()
    assert lora_tool([
        "extract", *base, "--input-name", str(merged), "--rank", "2", "--output-model-destination", str(again),
    ]) == 0  # fmt: skip
    report = capsys.readouterr().err
    assert f"{merged}: read as the transformer, over tiny:{variant}'s other parts" in report
    modules = lambda path: {k.split(".")[0] for k in load_file(str(path))}  # noqa: E731
    assert modules(again) == modules(lora)
    assert "within FLOAT_16's rounding, noise rather than training (transformer: " in report
