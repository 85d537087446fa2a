"""Loading SD 1.x / 2.x from every kind of source, offline, and the checks that guard it."""

from __future__ import annotations

import pickle

import pytest
import torch

from onetrainer.config import config_from_dict
from onetrainer.config.enums import NoiseScheduler
from onetrainer.families.loading import ModelLoadError
from onetrainer.families.sd import StableDiffusionFamily
from onetrainer.families.sources import ModelNotFound, resolve_source
from onetrainer.methods import create_method
from onetrainer.sampling.sampler import render
from onetrainer.tiny import tiny_model_dir
from onetrainer.weights.checkpoint_files import load_state_dict
from tests.helpers import local_config

FAMILY = StableDiffusionFamily()


def config(**data):
    cfg, problems = config_from_dict({"base_model_name": "tiny:sd15", "train_device": "cpu", **data})
    assert [p for p in problems if p.is_error] == []
    return local_config(cfg)


def unet_output(model) -> torch.Tensor:
    torch.manual_seed(0)
    unet = model.part("unet")
    x = torch.randn(1, unet.config.in_channels, 8, 8)
    with torch.no_grad():
        return unet(x, torch.tensor([321]), FAMILY.encode_text(model, ["a photo"]).hidden_states).sample


@pytest.fixture(scope="module")
def sd15_single_file(tmp_path_factory):
    model = FAMILY.load(config())
    path = tmp_path_factory.mktemp("single") / "sd15.safetensors"
    FAMILY.save_single_file(model, path, torch.float32)
    return path, unet_output(model)


def test_sources_are_told_apart(tmp_path):
    assert resolve_source(str(tiny_model_dir("sd15"))).kind == "diffusers"
    assert resolve_source("org/model-name").kind == "hub"
    (tmp_path / "m.ckpt").write_bytes(b"x")
    assert resolve_source(str(tmp_path / "m.ckpt")).kind == "single_file"
    with pytest.raises(ModelNotFound, match="not a diffusers model"):
        resolve_source(str(tmp_path))
    with pytest.raises(ModelNotFound, match="model not found"):
        resolve_source(str(tmp_path / "nothing.safetensors"))


def test_hub_id_offline_gives_a_clear_error():
    with pytest.raises(ModelLoadError, match="not in the local Hugging Face cache"):
        FAMILY.load(config(base_model_name="someone/not-a-cached-model", offline_mode=True))


def test_single_file_loads_offline_with_the_same_output(sd15_single_file):
    path, expected = sd15_single_file
    model = FAMILY.load(config(base_model_name=str(path)))
    assert torch.allclose(unet_output(model), expected, atol=1e-5)


def test_legacy_ckpt_loads_without_running_pickled_code(tmp_path, sd15_single_file, monkeypatch):
    path, expected = sd15_single_file
    # A .ckpt carries no configs: real ones take the bundled full-size configs; this tiny one needs the tiny configs.
    tiny = FAMILY.load(config())
    configs = {name: dict(tiny.part(name).config) for name in ("unet", "vae")}
    configs["text_encoder"] = tiny.part("text_encoder").config.to_dict()
    monkeypatch.setattr("onetrainer.families.sd._reference_configs", lambda model_type: configs)
    monkeypatch.setattr(
        "onetrainer.families.sd.single_file_tokenizer", lambda meta, v2: tiny.text_encoders[0].tokenizer
    )
    ckpt = tmp_path / "old.ckpt"
    # Old checkpoints pickle trainer objects (callbacks) beside the weights; this one runs code when unpickled.
    torch.save({"state_dict": load_state_dict(path), "global_step": 5, "callbacks": {"cb": _Exploding()}}, ckpt)
    _Exploding.ran = False
    with pytest.raises(pickle.UnpicklingError):
        torch.load(ckpt, weights_only=True)  # torch's safe loader refuses the file…
    model = FAMILY.load(config(base_model_name=str(ckpt)))  # …ours reads the weights without running anything
    assert not _Exploding.ran
    assert torch.allclose(unet_output(model), expected, atol=1e-5)


class _Exploding:
    """A pickled object whose loading would run code: loading a checkpoint must never do that."""

    ran = False

    def __reduce__(self):
        return (_Exploding._run, ())

    @staticmethod
    def _run():
        _Exploding.ran = True
        return None


def test_checkpoint_of_another_kind_is_refused(sd15_single_file):
    path, _ = sd15_single_file
    with pytest.raises(ModelLoadError, match=r"SD 1.x checkpoint.*STABLE_DIFFUSION_21"):
        FAMILY.load(config(base_model_name=str(path), model_type="STABLE_DIFFUSION_21"))
    with pytest.raises(ModelLoadError, match="not an inpainting checkpoint"):
        FAMILY.load(config(base_model_name=str(path), model_type="STABLE_DIFFUSION_15_INPAINTING"))


def test_v_prediction_comes_from_the_model_type():
    assert FAMILY.load(config(base_model_name="tiny:sd21", model_type="STABLE_DIFFUSION_21")).v_prediction
    assert not FAMILY.load(config(base_model_name="tiny:sd21-base", model_type="STABLE_DIFFUSION_21_BASE")).v_prediction
    forced = FAMILY.load(config(force_v_prediction=True))
    assert forced.v_prediction and forced.schedule.scheduler_config["prediction_type"] == "v_prediction"


def test_sd2_single_file_round_trip(tmp_path):
    model = FAMILY.load(config(base_model_name="tiny:sd21", model_type="STABLE_DIFFUSION_21"))
    path = tmp_path / "sd21.safetensors"
    FAMILY.save_single_file(model, path, torch.float16)
    state = load_state_dict(path)
    assert "cond_stage_model.model.transformer.resblocks.0.attn.in_proj_weight" in state
    assert "v_pred" in state and state["model.diffusion_model.input_blocks.0.0.weight"].dtype == torch.float16
    again = FAMILY.load(config(base_model_name=str(path), model_type="STABLE_DIFFUSION_21"))
    assert torch.allclose(unet_output(again), unet_output(model), atol=2e-2)


@pytest.mark.parametrize(("variant", "model_type"), [("sd15", "STABLE_DIFFUSION_15"), ("sd21", "STABLE_DIFFUSION_21")])
def test_zero_terminal_snr_single_file_carries_the_ztsnr_marker(tmp_path, variant, model_type):
    plain = FAMILY.load(config(base_model_name=f"tiny:{variant}", model_type=model_type))
    FAMILY.save_single_file(plain, tmp_path / "plain.safetensors", torch.float32)
    assert "ztsnr" not in load_state_dict(tmp_path / "plain.safetensors")
    zsnr = config(
        base_model_name=f"tiny:{variant}", model_type=model_type, rescale_noise_scheduler_to_zero_terminal_snr=True
    )
    model = FAMILY.load(zsnr)
    FAMILY.save_single_file(model, tmp_path / "zsnr.safetensors", torch.float32)
    state = load_state_dict(tmp_path / "zsnr.safetensors")
    assert state["v_pred"].numel() == 0 and state["ztsnr"].numel() == 0  # zero terminal SNR implies v-prediction
    zsnr.base_model_name = str(tmp_path / "zsnr.safetensors")
    assert torch.allclose(unet_output(FAMILY.load(zsnr)), unet_output(model), atol=1e-5)


def test_backup_of_a_finetune_is_a_base_model(tmp_path):
    model = FAMILY.load(config())
    backup = tmp_path / "backup"
    FAMILY.save_diffusers(model, backup / "model", torch.float32)
    (backup / "meta.json").write_text("{}")
    assert torch.allclose(unet_output(FAMILY.load(config(base_model_name=str(backup)))), unet_output(model))
    (tmp_path / "lora-backup").mkdir()
    (tmp_path / "lora-backup" / "meta.json").write_text("{}")
    with pytest.raises(ModelLoadError, match="backup of a LoRA or embedding run"):
        FAMILY.load(config(base_model_name=str(tmp_path / "lora-backup")))


def test_vae_override_from_a_diffusers_folder():
    model = FAMILY.load(config(vae={"model_name": str(tiny_model_dir("sd21"))}))
    assert model.part("vae").config.block_out_channels == FAMILY.load(config()).part("vae").config.block_out_channels


def test_frozen_parts_keep_their_weight_dtype():
    model = FAMILY.load(config(text_encoder={"weight_dtype": "BFLOAT_16"}, vae={"weight_dtype": "FLOAT_16"}))
    assert next(model.part("text_encoder").parameters()).dtype == torch.bfloat16
    assert next(model.part("vae").parameters()).dtype == torch.float16
    assert next(model.part("unet").parameters()).dtype == torch.float32


@pytest.mark.parametrize(
    ("preset", "expect", "reject"),
    [
        ("attn-mlp", "attentions.0.transformer_blocks.0.ff.net.2", "resnets.0.conv1"),
        ("attn-only", "attn1.to_q", "ff.net.2"),
        ("full", "resnets.0.conv1", None),
    ],
)
def test_layer_filter_presets(preset, expect, reject):
    cfg = config(training_method="LORA", output_model_format="KOHYA_LORA", layer_filter_preset=preset)
    model = FAMILY.load(cfg)
    method = create_method(cfg, FAMILY, model, torch.device("cpu"))
    targets = method.ranks["unet"]
    assert any(expect in t for t in targets)
    assert reject is None or not any(reject in t for t in targets)


def test_custom_regex_layer_filter():
    cfg = config(
        training_method="LORA", output_model_format="KOHYA_LORA", layer_filter_preset="custom",
        layer_filter=r"up_blocks\.\d\.attentions.*to_(q|k)$", layer_filter_regex=True,
    )  # fmt: skip
    model = FAMILY.load(cfg)
    targets = create_method(cfg, FAMILY, model, torch.device("cpu")).ranks["unet"]
    assert targets and all(t.startswith("up_blocks") and t.endswith(("to_q", "to_k")) for t in targets)


@pytest.mark.parametrize("sampler", list(NoiseScheduler))
def test_every_sampler_renders(sampler):
    model = FAMILY.load(config())
    sample = config(samples=[{"prompt": "x", "width": 64, "height": 64, "diffusion_steps": 3}]).samples[0]
    sample.noise_scheduler = sampler
    image = render(FAMILY, model, sample)
    assert image.size == (64, 64)
