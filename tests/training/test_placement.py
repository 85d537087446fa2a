"""Part placement: sample-only parts stay off the training device until a sample is rendered, and frozen encoders
whose outputs are cached leave it after caching (recorded by the Placement object, since the tests run on the CPU)."""

from __future__ import annotations

import torch

from onetrainer.config import config_from_dict
from onetrainer.families.base import PartRole
from onetrainer.training import trainer as trainer_module
from onetrainer.training.control import TrainingControl
from onetrainer.training.events import Finished, ListSink
from onetrainer.training.placement import DEVICE, OFFLOAD, Placement
from onetrainer.training.runner import run_training
from tests.helpers import image_folder, tiny_config

ROLES = {
    "prior": PartRole.DENOISER,
    "text_encoder": PartRole.TEXT_ENCODER,
    "effnet": PartRole.IMAGE_ENCODER,
    "decoder": PartRole.SAMPLING,
}


def placement() -> Placement:
    parts = {name: torch.nn.Linear(2, 2) for name in ROLES}
    return Placement(parts, ROLES, {"prior", "text_encoder", "decoder"}, "cpu")


def test_sampling_parts_come_in_for_samples_only_and_cached_encoders_leave():
    p = placement()
    p.place(n for n, r in ROLES.items() if r is not PartRole.SAMPLING)
    assert p.location == {"prior": DEVICE, "text_encoder": DEVICE, "effnet": DEVICE, "decoder": OFFLOAD}
    assert p.per_step([], latents_cached=True, text_cached=True) == {"prior"}
    assert p.per_step(["text_encoder"], latents_cached=True, text_cached=True) == {"prior", "text_encoder"}
    assert p.per_step([], latents_cached=False, text_cached=False) == {"prior", "text_encoder", "effnet"}
    p.place(p.per_step([], latents_cached=True, text_cached=True))
    assert p.on_device() == {"prior"}
    p.moves.clear()
    with p.for_sampling():
        assert p.on_device() == {"prior", "text_encoder", "decoder"}  # the effnet is not needed to sample
    assert p.on_device() == {"prior"}
    assert p.moves == [
        ("text_encoder", DEVICE), ("decoder", DEVICE), ("text_encoder", OFFLOAD), ("decoder", OFFLOAD),
    ]  # fmt: skip
    with p.for_encoding():
        assert p.on_device() == {"prior", "text_encoder", "effnet"}


def test_training_releases_cached_encoders_and_brings_them_back_to_sample(tmp_path, monkeypatch):
    made: list[Placement] = []
    seen_while_sampling: list[set[str]] = []

    class Recording(Placement):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    from onetrainer.families.sd import StableDiffusionFamily

    original = StableDiffusionFamily.sample

    def sample(self, model, *args):
        seen_while_sampling.append(made[0].on_device())
        return original(self, model, *args)

    monkeypatch.setattr(trainer_module, "Placement", Recording)
    monkeypatch.setattr(StableDiffusionFamily, "sample", sample)
    image_folder(tmp_path)
    samples = [{"prompt": "a shape", "width": 64, "height": 64, "diffusion_steps": 1}]
    config, _ = config_from_dict(
        tiny_config(
            tmp_path,
            epochs=1,
            samples=samples,
            sample_after=1,
            sample_after_unit="EPOCH",
            text_encoder={"train": False},
        )
    )
    outcome = run_training(config, TrainingControl(), [ListSink()])
    assert isinstance(outcome, Finished), outcome
    placed = made[0]
    # Latents and captions are cached and only the UNet's LoRA trains: the text encoder and VAE leave the device…
    assert ("text_encoder", OFFLOAD) in placed.moves and ("vae", OFFLOAD) in placed.moves
    assert placed.location == {"unet": DEVICE, "text_encoder": OFFLOAD, "vae": OFFLOAD}
    # …and come back for the sample.
    assert seen_while_sampling == [{"unet", "text_encoder", "vae"}]
