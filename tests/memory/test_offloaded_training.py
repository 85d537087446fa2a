"""Training with layer offloading gives what training without it gives: the same losses and the same trained weights,
for a LoRA (the transformer's blocks and T5's offloaded, the adapters on the device) and a fine-tune of the attention
(the frozen rest of each block offloaded), on tiny Flux dev through the trainer, with gradient checkpointing on (as
OneTrainer's offloading presets train) and off."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from onetrainer.training.events import Metrics
from tests.helpers import image_folder, run_config, tiny_config

RUNS = {
    "lora": {"method": "LORA", "output_model_format": "KOHYA_LORA", "layer_filter_preset": "attn-mlp"},
    "fine-tune": {
        "method": "FINE_TUNE",
        "output_model_format": "ORIGINAL_TRANSFORMER",
        "layer_filter_preset": "attn-only",
    },
}


def train(root: Path, run: str, fraction: float, checkpointing: bool) -> tuple[list[float], dict[str, torch.Tensor]]:
    image_folder(root, count=2)
    settings = dict(RUNS[run])
    method = settings.pop("method")
    config = tiny_config(
        root, variant="flux-dev", method=method, epochs=2, learning_rate=1e-3, **settings,
        output_model_destination=str(root / "out" / "model.safetensors"),
        transformer={"offload_fraction": fraction, "gradient_checkpointing": checkpointing,
                     "activation_offloading": fraction > 0},
        text_encoder={"train": False}, text_encoder_2={"train": False, "offload_fraction": fraction},
    )  # fmt: skip
    events = run_config(config)
    losses = [e.loss for e in events if isinstance(e, Metrics)]
    return losses, load_file(str(root / "out" / "model.safetensors"))


# The LoRA with gradient checkpointing (as the presets train), the fine-tune without (autograd keeps the weights the
# backward needs: the window must be back before it uses them); the toy model's tests cover the other two pairings.
@pytest.mark.parametrize(("run", "checkpointing"), [("lora", True), ("fine-tune", False)])
def test_offloaded_training_gives_the_same_losses_and_weights(
    tmp_path: Path, run: str, checkpointing: bool, monkeypatch
):
    # With checkpointing the offloaded run also keeps the checkpointed activations in CPU memory.
    packed = []

    class CountingSaveOnCpu(torch.autograd.graph.save_on_cpu):
        def __init__(self, pin_memory: bool = False, device_type: str = "cuda") -> None:
            super().__init__(pin_memory, device_type)
            pack = self.pack_hook

            def counting(tensor):
                packed.append(tensor.shape)
                return pack(tensor)

            self.pack_hook = counting

    monkeypatch.setattr(torch.autograd.graph, "save_on_cpu", CountingSaveOnCpu)
    losses, weights = train(tmp_path / "plain", run, 0.0, checkpointing)
    assert not packed
    offloaded_losses, offloaded_weights = train(tmp_path / "offloaded", run, 0.75, checkpointing)
    assert bool(packed) == checkpointing
    assert len(losses) == 2 and losses == offloaded_losses
    assert weights.keys() == offloaded_weights.keys()
    assert all(torch.equal(weights[k], offloaded_weights[k]) for k in weights)


def test_an_offloaded_text_encoder_is_on_the_device_while_it_fills_the_cache(tmp_path: Path, monkeypatch):
    """T5 offloaded and frozen: attached (its window on the training device) for the caching pass, detached after, as
    a cached encoder leaves the device; never encoding from the CPU copy it was loaded into."""
    from onetrainer.memory.layer_offload import LayerOffload
    from onetrainer.training import trainer

    order: list[str] = []
    real_attach, real_detach, real_fill = LayerOffload.attach, LayerOffload.detach, trainer.fill_text_cache

    def attach(self, device):
        order.append(f"attach {type(self.module).__name__}")
        return real_attach(self, device)

    def detach(self, device):
        order.append(f"detach {type(self.module).__name__}")
        return real_detach(self, device)

    def fill(*args, **kwargs):
        order.append("fill text cache")
        return real_fill(*args, **kwargs)

    monkeypatch.setattr(LayerOffload, "attach", attach)
    monkeypatch.setattr(LayerOffload, "detach", detach)
    monkeypatch.setattr(trainer, "fill_text_cache", fill)
    image_folder(tmp_path, count=2)
    config = tiny_config(tmp_path, variant="flux-dev", epochs=1, text_encoder={"train": False},
                         text_encoder_2={"train": False, "offload_fraction": 0.5})  # fmt: skip
    run_config(config)
    assert order[:3] == ["attach T5EncoderModel", "fill text cache", "detach T5EncoderModel"], order
