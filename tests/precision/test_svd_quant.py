"""SVDQuant: the low-rank factors plus the residual give the weight back, the corrected 8-bit layers err less than the
plain ones on a weight with dominant directions, their state dict is a plain layer's, decompositions are cached on
disk, and a run with `quantization.svd_dtype` trains with corrected layers in the denoiser only."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from onetrainer.config.enums import DataType
from onetrainer.precision import svd_quant
from onetrainer.precision.quantize import to_float8, to_scaled_8bit
from onetrainer.precision.svd_quant import SvdSettings, split_low_rank
from onetrainer.training.events import Metrics
from tests.helpers import image_folder, run_config, tiny_config

CPU = torch.device("cpu")


def _outlier_weight(rows: int = 48, columns: int = 64) -> torch.Tensor:
    """A weight whose range a few strong directions set (as trained transformers' outlier channels do)."""
    generator = torch.Generator().manual_seed(0)
    noise = torch.randn(rows, columns, generator=generator) * 0.02
    strong = torch.randn(rows, 2, generator=generator) @ torch.randn(2, columns, generator=generator)
    return noise + strong


def test_the_factors_and_the_residual_give_the_weight_back():
    weight = _outlier_weight()
    up, down, residual = split_low_rank(weight, SvdSettings(4, torch.float32, CPU))
    assert up.shape == (48, 4) and down.shape == (4, 64) and residual.dtype == weight.dtype
    assert torch.allclose(up @ down + residual, weight, atol=1e-5)
    assert residual.abs().max() < 0.2 * weight.abs().max()  # the dominant directions carried the range


@pytest.mark.parametrize("kind", ["FLOAT_8", "INT_8", "INT_W8A8"])
def test_a_corrected_layer_errs_less_and_saves_as_a_plain_one(kind):
    weight = _outlier_weight()
    x = torch.randn(32, 64, generator=torch.Generator().manual_seed(1))
    errors = {}
    for rank in (0, 4):
        layer = torch.nn.Sequential(torch.nn.Linear(64, 48, bias=False))
        layer[0].weight.data = weight.clone()
        svd = SvdSettings(rank, torch.bfloat16, CPU) if rank else None
        if kind == "FLOAT_8":
            to_float8(layer, svd=svd)
        else:
            to_scaled_8bit(layer, DataType[kind], svd=svd)
        errors[rank] = (layer(x) - x @ weight.T).abs().max().item()
        if rank:
            assert type(layer[0]).__name__.startswith("Svd") and layer[0].svd_up.dtype == torch.bfloat16
            state = layer.state_dict()
            assert set(state) == {"0.weight"} and state["0.weight"].dtype == torch.float32
            assert (state["0.weight"] - weight).abs().max() < 0.05 * weight.abs().max()
            inputs = x.clone().requires_grad_(True)
            layer(inputs).sum().backward()  # the input's gradient flows through both branches
            assert inputs.grad is not None and not layer[0].svd_up.requires_grad
    assert errors[4] < 0.5 * errors[0], errors


def test_decompositions_are_cached_on_disk(tmp_path: Path, monkeypatch):
    weight = _outlier_weight()
    settings = SvdSettings(4, torch.float32, CPU, tmp_path / "svd")
    first = split_low_rank(weight, settings)
    files = list((tmp_path / "svd").iterdir())
    assert len(files) == 1 and files[0].suffix == ".pt"  # written whole (no .partial left)

    def no_svd(*_args, **_kwargs):
        raise AssertionError("decomposed again")

    monkeypatch.setattr(torch.linalg, "svd", no_svd)
    again = split_low_rank(weight, settings)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    higher = split_low_rank(weight, SvdSettings(8, torch.float32, CPU, tmp_path / "svd"))  # up to 128 kept
    assert higher[0].shape == (48, 8)


def test_a_run_with_svd_quant_corrects_the_denoisers_quantized_layers(tmp_path: Path, monkeypatch):
    corrected = []
    real = svd_quant.attach_correction

    def counting(layer, up, down):
        corrected.append(up.shape[1])
        return real(layer, up, down)

    monkeypatch.setattr(svd_quant, "attach_correction", counting)
    image_folder(tmp_path, count=2)
    data = tiny_config(
        tmp_path, variant="flux-dev", epochs=1, transformer={"weight_dtype": "INT_W8A8"},
        text_encoder={"train": False}, text_encoder_2={"train": False, "weight_dtype": "FLOAT_8"},
        quantization={"svd_dtype": "BFLOAT_16", "svd_rank": 2},
    )  # fmt: skip
    losses = [e.loss for e in run_config(data) if isinstance(e, Metrics)]
    assert losses and all(torch.isfinite(torch.tensor(losses)))
    from diffusers import FluxTransformer2DModel

    from onetrainer.tiny import tiny_model_dir

    transformer = FluxTransformer2DModel.from_pretrained(tiny_model_dir("flux-dev"), subfolder="transformer")
    linears = sum(type(m) is torch.nn.Linear for m in transformer.modules())
    assert set(corrected) == {2} and len(corrected) == linears  # the transformer's Linears; T5 (quantized whole) none
    assert list((tmp_path / "cache" / "svd_quant").glob("*.pt"))  # under the run's cache directory
