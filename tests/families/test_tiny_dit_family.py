"""The family contract is general: a family defined only in `tests/families/tiny_dit_family.py` (a DiT on a
continuous cosine schedule with a masked T5 text encoder) trains LoRA, fine-tune and embedding and samples through
the generic trainer, methods, cache and sampler."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open

from onetrainer.config import config_from_dict
from onetrainer.sampling.sampler import render
from onetrainer.training.events import SampleReady
from tests.families import tiny_dit_family
from tests.families.tiny_dit_family import BASE_MODEL, MODEL_TYPE, TinyDiTFamily
from tests.helpers import image_folder, run_config, tiny_config

SAMPLE = {"prompt": "a red <shape>", "negative_prompt": "blue", "width": 64, "height": 64, "diffusion_steps": 2}


@pytest.fixture(autouse=True)
def registered(monkeypatch):
    tiny_dit_family.register(monkeypatch)


def train(root, method: str, **overrides) -> tuple[dict, list]:
    image_folder(root, placeholder="<shape>" if method == "EMBEDDING" else None)
    data = tiny_config(root, "sd15", method, **overrides)
    data.update(model_type=MODEL_TYPE.value, base_model_name=BASE_MODEL, layer_filter_preset="full")
    data["samples"] = [SAMPLE]
    data.update(sample_after=1, sample_after_unit="EPOCH", sample_image_format="PNG")
    if method == "FINE_TUNE":
        data["output_model_format"] = "SAFETENSORS"
    return data, run_config(data)


def losses_of(events) -> list[float]:
    from onetrainer.training.events import Metrics

    return [e.loss for e in events if isinstance(e, Metrics)]


def test_lora_on_the_dit_and_t5(tmp_path):
    data, events = train(tmp_path, "LORA", text_encoder={"train": True})
    assert all(torch.isfinite(torch.tensor(losses_of(events))))
    assert [e for e in events if isinstance(e, SampleReady)]  # sampled through the family during training
    with safe_open(data["output_model_destination"], "pt") as f:
        keys, metadata = list(f.keys()), f.metadata()
    modules = {k.partition(".")[0] for k in keys}
    assert any(m.startswith("lora_unet_blocks_0_attn2_to_q") for m in modules)
    # T5's blocks are named encoder.block.N: they get adapters like CLIP's encoder.layers.N.
    assert any(m.startswith("lora_te_encoder_block_0_layer_0_SelfAttention_q") for m in modules)
    assert not any("depthwise" in m for m in modules)  # a grouped conv gets no LoRA
    assert metadata["modelspec.architecture"] == "tiny-dit/lora" and metadata["ss_base_model_version"] == "tiny_dit"


def test_fine_tune_caches_masked_text_and_drops_captions_by_zeros(tmp_path):
    data, events = train(
        tmp_path, "FINE_TUNE", learning_rate=1e-3, text_encoder={"dropout_probability": 0.5, "train": False}
    )
    assert all(torch.isfinite(torch.tensor(losses_of(events))))
    cached = [torch.load(p, weights_only=True) for p in (tmp_path / "cache" / "text").rglob("*.pt")]
    assert cached and all(set(entry) == {"hidden_states", "attention_mask"} for entry in cached)
    config, _ = config_from_dict({**data, "base_model_name": data["output_model_destination"]})
    family = TinyDiTFamily()
    trained, base = family.load(config), family.load(config_from_dict({**data})[0])
    weight = "blocks.0.attn1.to_q.weight"
    assert not torch.equal(
        trained.part("transformer").state_dict()[weight], base.part("transformer").state_dict()[weight]
    )


def test_embedding_on_t5(tmp_path):
    data, _ = train(tmp_path, "EMBEDDING")
    with safe_open(data["output_model_destination"], "pt") as f:
        assert f.get_tensor("t5").shape == (2, tiny_dit_family.WIDTH)


def test_sampling_is_the_familys_and_follows_the_seed():
    config, _ = config_from_dict({"model_type": MODEL_TYPE.value, "base_model_name": BASE_MODEL})
    family = TinyDiTFamily()
    model = family.load(config)
    sample = config_from_dict({"samples": [SAMPLE]})[0].samples[0]
    one, two = render(family, model, sample), render(family, model, sample)
    assert one.size == (64, 64) and (torch.tensor(list(one.getdata())) == torch.tensor(list(two.getdata()))).all()
