"""`compile`: the denoiser's blocks compiled one at a time. The tests compile with torch's `aot_eager` backend (the
same graph capture and autograd tracing as the default inductor, without its minutes of C++ codegen on two cores):
results equal to the uncompiled ones, with layer offloading and gradient checkpointing on; a platform that cannot
compile is named by `--check` and the run trains uncompiled."""

from __future__ import annotations

import pytest
import torch

from onetrainer.memory import compile as compile_module
from onetrainer.memory.compile import compile_blocks, unavailable_reason
from onetrainer.memory.layer_offload import LayerOffload
from tests.memory.test_layer_offload import train, twin


@pytest.mark.parametrize("offloaded", [False, True], ids=["resident", "offloaded"])
def test_compiled_blocks_train_as_the_uncompiled_ones(offloaded):
    plain, compiled = twin(checkpointing=True)
    if offloaded:
        LayerOffload(compiled, ["first", "second"], 0.5).attach(torch.device("cpu"))
    assert compile_blocks(compiled, ["first", "second"], backend="aot_eager") == 6
    assert compile_blocks(compiled, ["first", "second"], backend="aot_eager") == 0  # compiled once
    losses, weights = train(compiled)
    expected_losses, expected_weights = train(plain)
    assert losses == pytest.approx(expected_losses, rel=1e-5)
    assert all(torch.allclose(weights[k], expected_weights[k], atol=1e-6) for k in weights)


def test_a_platform_without_a_compiler_is_named(monkeypatch):
    monkeypatch.setattr(compile_module.shutil, "which", lambda _name: None)
    assert "needs a C++ compiler" in unavailable_reason("cpu")
    import torch.utils._triton as triton

    monkeypatch.setattr(triton, "has_triton", lambda: False)
    assert "needs Triton" in unavailable_reason("cuda")
    assert "not supported" in unavailable_reason("meta")


def test_check_says_where_compile_does_nothing(monkeypatch, tmp_path):
    from onetrainer.config import config_from_dict
    from onetrainer.training.checks import check_compile
    from tests.helpers import tiny_config

    def warnings(variant: str) -> list[str]:
        config, _ = config_from_dict(tiny_config(tmp_path, variant=variant, compile=True))
        return [p.message for p in check_compile(config) if not p.is_error]

    assert "Stable Diffusion XL's unet does not (yet)" in warnings("sdxl")[0]
    monkeypatch.setattr(compile_module.shutil, "which", lambda _name: None)
    assert "needs a C++ compiler" in warnings("flux-dev")[0]


def test_the_trainer_compiles_the_flux_transformers_blocks(monkeypatch, tmp_path):
    from onetrainer.training.events import Metrics, Status
    from tests.helpers import image_folder, run_config, tiny_config

    monkeypatch.setattr(compile_module, "BACKEND", "aot_eager")
    monkeypatch.setattr(compile_module, "unavailable_reason", lambda _device: None)
    image_folder(tmp_path, count=2)
    config = tiny_config(tmp_path, variant="flux-dev", epochs=1, compile=True, transformer={"offload_fraction": 0.5},
                         text_encoder={"train": False}, text_encoder_2={"train": False})  # fmt: skip
    events = run_config(config)
    assert any(isinstance(e, Status) and "4 blocks compile on first use" in e.text for e in events)
    losses = [e.loss for e in events if isinstance(e, Metrics)]
    assert losses and all(torch.isfinite(torch.tensor(losses)))
