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
    # The whole transformer trained: its blocks move with their optimizer state (the fused back pass updates them).
    "fine-tune-fused": {"method": "FINE_TUNE", "output_model_format": "ORIGINAL_TRANSFORMER", "layer_filter": ""},
}


def train(
    root: Path, run: str, fraction: float, checkpointing: bool, fused: bool = False, resumed: bool = False
) -> tuple[list[float], dict[str, torch.Tensor]]:
    image_folder(root, count=2)
    settings = dict(RUNS[run])
    method = settings.pop("method")
    if fused:  # clipping the whole gradient's norm has no fused equivalent: neither run clips
        settings.update(optimizer={"optimizer": "ADAMW", "fused_back_pass": True}, clip_grad_norm=None)
    elif run == "fine-tune-fused":
        settings.update(clip_grad_norm=None)
    config = tiny_config(
        root, variant="flux-dev", method=method, epochs=2, learning_rate=1e-3, **settings,
        output_model_destination=str(root / "out" / "model.safetensors"),
        transformer={"offload_fraction": fraction, "gradient_checkpointing": checkpointing,
                     "activation_offloading": fraction > 0},
        text_encoder={"train": False}, text_encoder_2={"train": False, "offload_fraction": fraction},
    )  # fmt: skip
    if resumed:  # stopped after the first step (a backup), then continued from it
        events = _stopped_after_one_step(config) + run_config({**config, "continue_last_backup": True})
    else:
        events = run_config(config)
    losses = [e.loss for e in events if isinstance(e, Metrics)]
    return losses, load_file(str(root / "out" / "model.safetensors"))


def _stopped_after_one_step(data: dict) -> list:
    from onetrainer.config import config_from_dict
    from onetrainer.training.control import TrainingControl
    from onetrainer.training.events import Finished, ListSink, Progress
    from onetrainer.training.runner import run_training

    control = TrainingControl()

    class StopAfterOne(ListSink):
        def emit(self, event) -> None:
            super().emit(event)
            if isinstance(event, Progress) and event.global_step >= 1:
                control.request_stop()

    config, _ = config_from_dict({**data, "backup_before_save": True})
    sink = StopAfterOne()
    outcome = run_training(config, control, [sink])
    assert isinstance(outcome, Finished) and outcome.reason == "stopped"
    return sink.events


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
    from onetrainer.training import preparation

    order: list[str] = []
    real_attach, real_detach, real_fill = LayerOffload.attach, LayerOffload.detach, preparation.fill_text_cache

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
    monkeypatch.setattr(preparation, "fill_text_cache", fill)
    image_folder(tmp_path, count=2)
    config = tiny_config(tmp_path, variant="flux-dev", epochs=1, text_encoder={"train": False},
                         text_encoder_2={"train": False, "offload_fraction": 0.5})  # fmt: skip
    run_config(config)
    assert order[:3] == ["attach T5EncoderModel", "fill text cache", "detach T5EncoderModel"], order


def test_a_fine_tune_offloaded_with_the_fused_back_pass_trains_as_without_both(tmp_path: Path):
    """Ordinary training (every gradient held, one optimizer step) against the whole transformer's blocks offloaded
    with their AdamW state, each weight updated as its gradient arrives, stopped after the first step and resumed from
    its backup (the weights and the optimizer's state read back into the offloaded blocks): the same losses and
    weights."""
    losses, weights = train(tmp_path / "plain", "fine-tune-fused", 0.0, True)
    offloaded_losses, offloaded_weights = train(
        tmp_path / "offloaded", "fine-tune-fused", 0.75, True, fused=True, resumed=True
    )
    assert len(losses) == 2 and losses == offloaded_losses
    assert weights.keys() == offloaded_weights.keys()
    assert all(torch.equal(weights[k], offloaded_weights[k]) for k in weights)


def test_onetrainers_8gb_chroma_fine_tune_trains_with_its_trained_blocks_offloaded(in_tmp: Path, capsys):
    """OneTrainer's "#chroma Finetune 8GB" preset as its app loads it (the fused back pass and stochastic rounding from
    the remembered Adafactor settings), on tiny Chroma: 85 % of the blocks offloaded with their trained weights and
    optimizer state, BFLOAT_16, through scripts/train.py. It trains, the checks name no offloading caveat, and the saved
    transformer changed."""
    import json

    from onetrainer.cli.train import EXIT_OK, main
    from tests.conftest import onetrainer_presets_dir

    folder = image_folder(in_tmp, count=2)
    preset = onetrainer_presets_dir() / "Chroma" / "#chroma Finetune 8GB.json"
    output = in_tmp / "out" / "chroma.safetensors"
    sets = {
        "base_model_name": "tiny:chroma", "concepts": json.dumps([{"name": "shapes", "path": str(folder)}]),
        "optimizer.fused_back_pass": "true", "optimizer.stochastic_rounding": "true", "epochs": "1",
        "resolution": "64", "output_model_destination": str(output),
        "workspace_dir": str(in_tmp / "workspace"), "cache_dir": str(in_tmp / "cache"),
    }  # fmt: skip
    argv = ["--config-path", str(preset), *(a for k, v in sets.items() for a in ("--set", f"{k}={v}"))]
    assert main(argv) == EXIT_OK
    err = capsys.readouterr().err
    assert "offload_fraction 0.85 on the transformer" not in err and "but off in the optimizer block" not in err
    assert (
        "clip_grad_norm 1 clips each weight's gradient on its own with the fused back pass" in err
    )  # said, not hidden
    saved = load_file(str(output))
    assert saved and all(torch.isfinite(t.float()).all() for t in saved.values())
