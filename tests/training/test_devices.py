"""The training device: the configured one where it exists, else the CPU with a warning; on CUDA, attention never
through cuDNN's SDPA (its backward fails at Flux's size on current cuDNN)."""

from __future__ import annotations

import torch

from onetrainer.training.devices import select_device


def test_a_missing_cuda_device_falls_back_to_the_cpu_with_a_warning(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    warnings: list[str] = []
    assert select_device("cuda", warnings.append) == torch.device("cpu")
    assert warnings and "no CUDA device" in warnings[0]
    assert select_device("", warnings.append) == torch.device("cpu") and len(warnings) == 1


def test_training_on_cuda_turns_cudnn_attention_off(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    before = torch.backends.cuda.cudnn_sdp_enabled()
    try:
        torch.backends.cuda.enable_cudnn_sdp(True)
        assert select_device("cpu", print) == torch.device("cpu") and torch.backends.cuda.cudnn_sdp_enabled()
        assert select_device("cuda:0", print) == torch.device("cuda:0")
        assert not torch.backends.cuda.cudnn_sdp_enabled()
    finally:
        torch.backends.cuda.enable_cudnn_sdp(before)
