"""`attention_mechanism` (OneTrainer's setting): CUDNN and FLASH put that torch attention kernel first for the whole
run and leave torch's own order after it; on a CPU, which neither kernel serves, the run trains as SDP does; FLEX is
named as not built."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from onetrainer.config import config_from_dict
from onetrainer.config.enums import AttentionMechanism
from onetrainer.training import trainer as trainer_module
from onetrainer.training.attention import attention_kernels
from onetrainer.training.control import TrainingControl
from onetrainer.training.events import Finished
from onetrainer.training.runner import run_training
from tests.helpers import image_folder, tiny_config


def _order() -> list[int]:
    """The kernels SDPA may pick, in its order of preference (a disabled one's place means nothing: left out)."""
    from torch.nn.attention import SDPBackend

    enabled = {
        int(SDPBackend.FLASH_ATTENTION): torch.backends.cuda.flash_sdp_enabled(),
        int(SDPBackend.EFFICIENT_ATTENTION): torch.backends.cuda.mem_efficient_sdp_enabled(),
        int(SDPBackend.MATH): torch.backends.cuda.math_sdp_enabled(),
        int(SDPBackend.CUDNN_ATTENTION): torch.backends.cuda.cudnn_sdp_enabled(),
    }
    return [b for b in torch._C._get_sdp_priority_order() if enabled.get(b)]


@pytest.mark.parametrize(
    ("mechanism", "first"),
    [(AttentionMechanism.CUDNN, "CUDNN_ATTENTION"), (AttentionMechanism.FLASH, "FLASH_ATTENTION")],
)
def test_the_kernel_asked_for_comes_first_while_the_context_is_open(mechanism, first):
    from torch.nn.attention import SDPBackend

    before = _order()
    with attention_kernels(mechanism):
        inside = _order()
        assert inside[0] == int(getattr(SDPBackend, first)) and int(SDPBackend.MATH) in inside
        # FLASH never falls back to cuDNN's kernel (its backward failed at a large model's size, devices.py)
        assert (int(SDPBackend.CUDNN_ATTENTION) in inside) is (mechanism is AttentionMechanism.CUDNN)
    assert _order() == before
    with attention_kernels(AttentionMechanism.SDP):
        assert _order() == before


def test_flex_is_named_as_not_built():
    _, problems = config_from_dict({"attention_mechanism": "FLEX"})
    (error,) = [p for p in problems if p.is_error]
    assert error.path == "attention_mechanism" and "FLEX" in error.message and "not built" in error.message


def _train(root: Path, mechanism: str, monkeypatch) -> tuple[dict, list[list[int]]]:
    seen: list[list[int]] = []
    step = trainer_module.Trainer.train_step

    def recorded(self, batches):
        seen.append(_order())
        return step(self, batches)

    monkeypatch.setattr(trainer_module.Trainer, "train_step", recorded)
    image_folder(root, count=2)
    data = tiny_config(root, "pixart", method="LORA", epochs=1, attention_mechanism=mechanism)
    config, problems = config_from_dict(data)
    assert [p for p in problems if p.is_error] == []
    assert isinstance(run_training(config, TrainingControl(), []), Finished)
    return load_file(data["output_model_destination"]), seen


def test_a_cudnn_run_steps_with_cudnn_first_and_trains_on_a_cpu_as_sdp_does(tmp_path, monkeypatch):
    from torch.nn.attention import SDPBackend

    before = _order()
    cudnn, orders = _train(tmp_path / "cudnn", "CUDNN", monkeypatch)
    assert orders and all(o[0] == int(SDPBackend.CUDNN_ATTENTION) for o in orders)
    assert _order() == before  # the run's end restores torch's order
    sdp, orders = _train(tmp_path / "sdp", "SDP", monkeypatch)
    assert all(o == before for o in orders)
    assert cudnn.keys() == sdp.keys() and all(torch.equal(cudnn[k], sdp[k]) for k in sdp)
