"""The trainer's loss terms beyond the configured losses: a family's own terms, learned-variance channels, and what
the step hands the schedule."""

from __future__ import annotations

import pytest
import torch

from onetrainer.config import config_from_dict
from onetrainer.noise.discrete import DiscreteSchedule
from onetrainer.noise.prediction import Prediction


def test_family_loss_terms_are_added_and_logged(tmp_path, monkeypatch):
    """A family's extra loss term adds to the loss and gets its own scalar; variance channels at vb_loss_strength 0
    add nothing; the schedule draws its times knowing the batch's latent shape."""
    from onetrainer.families.sd import StableDiffusionFamily
    from onetrainer.training.control import TrainingControl
    from onetrainer.training.events import ListSink, Metrics
    from onetrainer.training.runner import run_training
    from tests.helpers import image_folder, read_scalars, tiny_config

    original = StableDiffusionFamily.predict
    original_times = DiscreteSchedule.sample_times
    shapes = []

    def with_term(self, model, noisy, times, conditioning, extra):
        prediction = original(self, model, noisy, times, conditioning, extra)
        term = torch.full((len(noisy),), 10.0) + 0 * prediction.output.float().mean()
        return Prediction(prediction.output, {"extra": term}, variance=torch.zeros_like(prediction.output))

    def recording_times(self, count, generator, settings, device, latent_shape=None):
        shapes.append(tuple(latent_shape))
        return original_times(self, count, generator, settings, device, latent_shape)

    def losses(patched: bool) -> list[float]:
        root = tmp_path / str(patched)
        image_folder(root)
        config, _ = config_from_dict(tiny_config(root, epochs=1, vb_loss_strength=0.0))
        sink = ListSink()
        run_training(config, TrainingControl(), [sink])
        return root, [e.loss for e in sink.events if isinstance(e, Metrics)]

    _, plain = losses(False)
    monkeypatch.setattr(StableDiffusionFamily, "predict", with_term)
    monkeypatch.setattr(DiscreteSchedule, "sample_times", recording_times)
    root, with_term_losses = losses(True)
    assert [b - a for a, b in zip(plain, with_term_losses)] == pytest.approx([10.0] * len(plain), rel=1e-4)
    scalars = read_scalars(root / "workspace" / "tensorboard")
    assert [v for _, v in scalars["loss/extra"]] == pytest.approx([10.0] * len(plain))
    assert "loss/vb" not in scalars
    assert shapes and all(len(s) == 4 and s[0] == 2 and s[2:] == (8, 8) for s in shapes)  # 64 px → 8×8 latents
