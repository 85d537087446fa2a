"""Text-encoder options (clip skip, caption dropout), per-concept loss weight and gradient checkpointing."""

from __future__ import annotations

import pytest
import torch

from onetrainer.config import config_from_dict
from onetrainer.families.sd import StableDiffusionFamily
from onetrainer.methods import create_method
from onetrainer.training.control import TrainingControl
from onetrainer.training.events import Finished, ListSink, Metrics
from onetrainer.training.runner import run_training
from tests.helpers import image_folder, local_config, tiny_config

FAMILY = StableDiffusionFamily()


def run(config_dict):
    config, problems = config_from_dict(config_dict)
    assert [p for p in problems if p.is_error] == []
    sink = ListSink()
    return run_training(config, TrainingControl(), [sink]), sink


def test_clip_skip_uses_an_earlier_layer_through_the_final_norm():
    config, _ = config_from_dict({"base_model_name": "tiny:sd15", "text_encoder_layer_skip": 1})
    model = FAMILY.load(local_config(config))
    tokens = FAMILY.tokenize(model, ["a red circle"])
    encoder = model.part("text_encoder")
    with torch.no_grad():
        skipped = FAMILY.encode_text(model, ["a red circle"]).hidden_states
        states = encoder(tokens[0], output_hidden_states=True).hidden_states
        assert torch.allclose(skipped, encoder.final_layer_norm(states[-2]))
        model.text_encoders[0].layer_skip = 0
        assert not torch.allclose(skipped, FAMILY.encode_text(model, ["a red circle"]).hidden_states)


def test_caption_dropout_of_one_hides_every_caption(tmp_path):
    image_folder(tmp_path, placeholder="<shape>")
    common = {"method": "EMBEDDING", "epochs": 1}
    outcome, _ = run(tiny_config(tmp_path, text_encoder={"dropout_probability": 1.0}, **common))
    assert isinstance(outcome, Finished)
    from safetensors.torch import load_file

    trained = load_file(str(tmp_path / "out" / "embedding.safetensors"))["emb_params"]
    config, _ = config_from_dict(tiny_config(tmp_path, **common))
    model = FAMILY.load(local_config(config))
    initial = create_method(config, FAMILY, model, torch.device("cpu")).embeddings.embeddings[0].vectors
    # Every caption was dropped, so the placeholder was never seen and its vectors never changed.
    assert torch.allclose(trained.float(), initial["text_encoder"].float())


@pytest.mark.parametrize("cached", [True, False], ids=["text-cache", "encoded"])
def test_sdxl_caption_dropout_is_drawn_per_text_encoder(tmp_path, monkeypatch, cached):
    """Dropout 1.0 on SDXL's first encoder and 0.0 on its second: the denoiser gets the empty caption's states from
    encoder 1 and the captions' from encoder 2 (and its pooled embedding), from the text cache or encoded each step."""
    from onetrainer.families.sdxl import StableDiffusionXLFamily

    seen = []
    predict = StableDiffusionXLFamily.predict

    def recording(self, model, noisy_latents, timesteps, conditioning, extra):
        seen.append({k: v.detach().float().clone() for k, v in conditioning.tensors.items()})
        return predict(self, model, noisy_latents, timesteps, conditioning, extra)

    monkeypatch.setattr(StableDiffusionXLFamily, "predict", recording)
    image_folder(tmp_path)
    parts = {
        "text_encoder": {"dropout_probability": 1.0, "train": False},
        # a trained encoder turns the text cache off; its LoRA starts as the identity, so step 1 sees the base model
        "text_encoder_2": {"dropout_probability": 0.0, "train": not cached},
    }
    outcome, _ = run(tiny_config(tmp_path, "sdxl", "LORA", epochs=1, **parts))
    assert isinstance(outcome, Finished) and seen
    family = StableDiffusionXLFamily()
    config, _ = config_from_dict(tiny_config(tmp_path, "sdxl", "LORA"))
    with torch.no_grad():
        empty = family.encode_text(family.load(local_config(config)), [""])
    first = seen[0]
    width = 32  # the tiny SDXL's first encoder
    assert torch.allclose(first["hidden_states"][..., :width], empty.hidden_states[..., :width].expand(2, -1, -1))
    assert not torch.allclose(first["hidden_states"][..., width:], empty.hidden_states[..., width:].expand(2, -1, -1))
    assert not torch.allclose(first["pooled"], empty.pooled.expand(2, -1))


def test_a_concept_loss_weight_of_zero_trains_nothing(tmp_path):
    image_folder(tmp_path)
    config = tiny_config(tmp_path, epochs=1)
    config["concepts"][0]["loss_weight"] = 0.0
    outcome, sink = run(config)
    assert isinstance(outcome, Finished)
    assert all(m.loss == 0.0 for m in sink.of(Metrics))


def test_gradient_checkpointing_is_enabled_per_part():
    config, _ = config_from_dict(
        {"base_model_name": "tiny:sd15", "training_method": "LORA", "output_model_format": "KOHYA_LORA",
         "text_encoder": {"train": True, "gradient_checkpointing": False}}
    )  # fmt: skip
    model = FAMILY.load(local_config(config))
    method = create_method(config, FAMILY, model, torch.device("cpu"))
    assert method.enable_gradient_checkpointing() == ["unet"]
    assert model.part("unet").is_gradient_checkpointing
    assert not model.part("text_encoder").is_activation_checkpointing

    config.text_encoder.gradient_checkpointing = True
    assert method.enable_gradient_checkpointing() == ["unet", "text_encoder"]
    assert model.part("text_encoder").is_activation_checkpointing
