"""Würstchen v2 and Stable Cascade (one family module, two variants) on their tiny models: text conditioning and
latents as the diffusers pipelines and the published encoders make them, the schedule's remap, the precision check,
the layer presets, and a sample through prior → decoder → VQGAN."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from onetrainer.config import config_from_dict
from onetrainer.families import effnet
from onetrainer.families.loading import ModelLoadError
from onetrainer.families.wuerstchen import CascadeFamily, WuerstchenFamily
from onetrainer.sampling.sampler import render
from onetrainer.training.checks import run_checks
from tests.helpers import local_config

VARIANTS = {"WUERSTCHEN_2": ("tiny:wuerstchen", WuerstchenFamily), "STABLE_CASCADE_1": ("tiny:cascade", CascadeFamily)}
SAMPLE = {"prompt": "a red square", "negative_prompt": "blue", "width": 128, "height": 128, "diffusion_steps": 2}


@pytest.fixture(scope="module", params=list(VARIANTS))
def loaded(request):
    base, cls = VARIANTS[request.param]
    config, _ = config_from_dict({"model_type": request.param, "base_model_name": base})
    family = cls()
    return family, family.load(local_config(config))


def cascade(model) -> bool:
    return model.model_type.value == "STABLE_CASCADE_1"


def prior_pipeline(family, model):
    from diffusers import DDPMWuerstchenScheduler, StableCascadePriorPipeline
    from diffusers.pipelines.deprecated.wuerstchen import WuerstchenPriorPipeline

    parts = {
        "prior": model.part("prior"),
        "text_encoder": model.part("text_encoder"),
        "tokenizer": model.text_encoders[0].tokenizer,
        "scheduler": DDPMWuerstchenScheduler(),
    }
    if cascade(model):
        return StableCascadePriorPipeline(**parts, image_encoder=None, feature_extractor=None)
    return WuerstchenPriorPipeline(**parts)


def test_text_conditioning_is_what_the_prior_pipeline_computes(loaded):
    family, model = loaded
    pipe = prior_pipeline(family, model)
    with torch.no_grad():
        ours = family.encode_text(model, ["a red square", "x"])
        if cascade(model):
            hidden, pooled, _, _ = pipe.encode_prompt("cpu", 2, 1, False, prompt=["a red square", "x"])
            torch.testing.assert_close(ours.pooled[:, None], pooled)
        else:
            hidden, _ = pipe.encode_prompt("cpu", 1, False, prompt=["a red square", "x"])
    torch.testing.assert_close(ours.hidden_states, hidden)
    assert ours.get("attention_mask").shape == (2, 77) and ours.get("attention_mask")[1].sum() == 3  # bos, x, eos


def test_latents_come_from_the_effnet_scaled_per_variant(loaded):
    family, model = loaded
    pixels = torch.rand(2, 3, 128, 128) * 2 - 1
    latents = family.encode_images(model, pixels)
    assert latents.shape == (2, 16, *effnet.latent_size(128, 128)) == (2, 16, 3, 3)
    encoder = model.part("effnet_encoder")
    raw = encoder(effnet.preprocess((pixels + 1) / 2))
    expected = raw if cascade(model) else (raw + 1) / 42
    torch.testing.assert_close(latents, expected)


def test_prediction_and_the_remapped_schedule(loaded):
    family, model = loaded
    t = model.schedule.validation_times(torch.tensor([0.5, 0.5]), "cpu")
    # Half-way along the schedule, t = 0.5, remapped per variant.
    assert torch.allclose(t, torch.tensor(0.501 if cascade(model) else 1.08 * 0.5 + 0.001))
    latents = torch.randn(2, 16, 3, 3)
    with torch.no_grad():
        conditioning = family.encode_text(model, ["a", "b"])
        output = family.predict(model, latents, t, conditioning, {}).output
        prior = model.part("prior")
        if cascade(model):
            clip_img = torch.zeros(2, 1, prior.config.clip_image_in_channels)
            direct = prior(latents, t, conditioning.pooled[:, None], conditioning.hidden_states, clip_img).sample
        else:
            direct = prior(latents, t, conditioning.hidden_states)
    assert output.shape == latents.shape and torch.equal(output, direct)


def test_layer_presets_each_select_lora_targets_and_never_a_depthwise_conv(loaded):
    family, model = loaded
    for name, patterns in family.info.layer_presets.items():
        targets = family.lora_targets(model, "prior", list(patterns), False)
        assert targets, f"preset {name} selects nothing"
        assert not any(n.endswith("depthwise") for n in targets)
    assert ("down-blocks" in family.info.layer_presets) == cascade(model)  # Würstchen's prior is flat
    assert family.lora_targets(model, "text_encoder", [], False)


def test_sample_renders_through_prior_decoder_and_vqgan(loaded):
    family, model = loaded
    sample = config_from_dict({"samples": [SAMPLE]})[0].samples[0]
    image = render(family, model, sample)
    assert image.size == (128, 128)
    pixels = torch.from_numpy(np.asarray(image, dtype=np.float32))
    assert pixels.std() > 0  # the VQGAN's output, not a blank image


def test_float16_weights_are_refused_for_the_cascade_prior_before_training():
    data = {"model_type": "STABLE_CASCADE_1", "base_model_name": "tiny:cascade", "prior": {"weight_dtype": "FLOAT_16"}}
    config, _ = config_from_dict(data)
    problems = [p for p in run_checks(config) if p.path == "prior.weight_dtype"]
    assert problems and problems[0].is_error
    assert "BFLOAT_16" in problems[0].message and "FLOAT_32" in problems[0].message
    wuerstchen, _ = config_from_dict({**data, "model_type": "WUERSTCHEN_2", "base_model_name": "tiny:wuerstchen"})
    assert not [p for p in run_checks(wuerstchen) if p.path == "prior.weight_dtype"]


@pytest.mark.parametrize(("fallback", "expected"), [("BFLOAT_16", torch.bfloat16), ("FLOAT_32", torch.float32)])
def test_a_float16_training_dtype_runs_the_cascade_prior_in_the_fallback_dtype(fallback, expected):
    data = {"model_type": "STABLE_CASCADE_1", "base_model_name": "tiny:cascade", "train_dtype": "FLOAT_16"}
    config, _ = config_from_dict({**data, "fallback_train_dtype": fallback})
    assert not [p for p in run_checks(config) if p.is_error and "FLOAT_16" in p.message]
    family = CascadeFamily()
    model = family.load(local_config(config))
    seen = []
    first_linear = next(m for m in model.part("prior").modules() if isinstance(m, torch.nn.Linear))
    first_linear.register_forward_hook(lambda module, args, output: seen.append(output.dtype))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.float16):  # what the trainer enters for FLOAT_16
        conditioning = family.encode_text(model, ["a"])
        output = family.predict(model, torch.randn(1, 16, 3, 3), torch.tensor([0.5]), conditioning, {}).output
    assert seen and set(seen) == {expected} and torch.isfinite(output).all()


# -- training in process (the generic trainer, methods and cache) ----------------------------------------------------


def train(root, model_type: str, method: str, **overrides) -> tuple[dict, list]:
    from tests.helpers import image_folder, run_config, tiny_config

    image_folder(root, placeholder="<shape>" if method == "EMBEDDING" else None)
    variant = VARIANTS[model_type][0].removeprefix("tiny:")
    settings = {"resolution": "128", "loss_weight_fn": "P2", "layer_filter_preset": "full"}
    data = tiny_config(root, variant, method, **{**settings, **overrides})
    return data, run_config(data)


def losses_of(events) -> list[float]:
    from onetrainer.training.events import Metrics

    return [e.loss for e in events if isinstance(e, Metrics)]


def test_wuerstchen_kohya_lora_names_the_prior_and_text_encoder_modules(tmp_path):
    # Cascade's kohya / legacy names (native stage C paths) are checked in test_wuerstchen_outputs.py.
    from safetensors import safe_open

    data, events = train(tmp_path, "WUERSTCHEN_2", "LORA", text_encoder={"train": True})
    assert losses_of(events) and all(torch.isfinite(torch.tensor(losses_of(events))))
    with safe_open(data["output_model_destination"], "pt") as f:
        keys = list(f.keys())
    modules = {k.partition(".")[0] for k in keys}
    assert any(m.startswith("lora_unet_") and "attention" in m for m in modules)
    assert any(m.startswith("lora_te_text_model_encoder_layers_0_") for m in modules)
    assert not any("depthwise" in m for m in modules)


def test_fine_tune_saved_as_the_prior_pipeline_folder_loads_back(loaded, tmp_path):
    from onetrainer.config.enums import ModelFormat
    from onetrainer.tiny.effnet import save_effnet_encoder

    family, model = loaded
    family.save(model, ModelFormat.DIFFUSERS, tmp_path / "prior", torch.float32)
    effnet_file = save_effnet_encoder(tmp_path / "effnet.safetensors", wuerstchen=not cascade(model))
    data = {
        "model_type": model.model_type.value,
        "base_model_name": str(tmp_path / "prior"),
        "decoder": {"model_name": VARIANTS[model.model_type.value][0] + "-decoder"},
        "effnet_encoder": {"model_name": str(effnet_file)},
    }
    reloaded = family.load(local_config(config_from_dict(data)[0]))
    latents, t = torch.randn(1, 16, 3, 3), torch.tensor([0.3])
    with torch.no_grad():
        ours = family.predict(model, latents, t, family.encode_text(model, ["a"]), {}).output
        theirs = family.predict(reloaded, latents, t, family.encode_text(reloaded, ["a"]), {}).output
    torch.testing.assert_close(ours, theirs)
    data["effnet_encoder"] = {"model_name": ""}
    with pytest.raises(ModelLoadError, match=r"effnet_encoder\.model_name"):
        family.load(local_config(config_from_dict(data)[0]))


def test_the_prior_part_may_come_from_its_own_folder_but_a_single_file_only_for_cascade(tmp_path):
    import shutil

    from safetensors.torch import save_file

    from onetrainer.tiny import tiny_model_dir

    base = {"model_type": "WUERSTCHEN_2", "base_model_name": "tiny:wuerstchen"}
    shutil.copytree(tiny_model_dir("wuerstchen") / "prior", tmp_path / "prior")  # a prior folder of its own
    family = WuerstchenFamily()
    model = family.load(local_config(config_from_dict({**base, "prior": {"model_name": str(tmp_path / "prior")}})[0]))
    expected = family.load(local_config(config_from_dict(base)[0])).part("prior").state_dict()
    assert all(torch.equal(v, expected[k]) for k, v in model.part("prior").state_dict().items())
    single = tmp_path / "stage_c.safetensors"
    save_file({"x": torch.zeros(1)}, str(single))
    with pytest.raises(ModelLoadError, match=r"prior\.model_name: .* single file"):
        family.load(local_config(config_from_dict({**base, "prior": {"model_name": str(single)}})[0]))


def test_a_bfloat16_save_leaves_the_training_weights_as_they_are(loaded, tmp_path):
    from onetrainer.config.enums import ModelFormat

    family, model = loaded
    before = {k: v.clone() for k, v in model.part("prior").state_dict().items()}
    family.save(model, ModelFormat.DIFFUSERS, tmp_path / "prior", torch.bfloat16)
    after = model.part("prior").state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # not rounded to bfloat16 and back
    from safetensors.torch import load_file

    saved = load_file(str(next((tmp_path / "prior" / "prior").glob("*.safetensors"))))
    assert {v.dtype for v in saved.values() if v.is_floating_point()} == {torch.bfloat16}
