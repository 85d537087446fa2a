"""SD 2.0 depth (STABLE_DIFFUSION_20_DEPTH): the UNet's fifth input channel, the depth map, as diffusers'
StableDiffusionDepth2ImgPipeline gives it, on the tiny model."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from onetrainer.config import config_from_dict
from onetrainer.families.depth import DEPTH_EXTRA, normalise_depth
from onetrainer.families.loading import ModelLoadError
from onetrainer.families.sd import SDState, StableDiffusionFamily
from onetrainer.tiny import tiny_model_dir
from tests.helpers import local_config

FAMILY = StableDiffusionFamily()


def config(**data):
    values = {"base_model_name": "tiny:sd20-depth", "model_type": "STABLE_DIFFUSION_20_DEPTH", "train_device": "cpu"}
    cfg, problems = config_from_dict({**values, **data})
    assert [p for p in problems if p.is_error] == []
    return local_config(cfg)


@pytest.fixture(scope="module")
def model():
    return FAMILY.load(config())


def _picture(seed: int, size: int = 64) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8))


def _pixels(image: Image.Image) -> torch.Tensor:
    return torch.from_numpy(np.asarray(image, dtype=np.float32) / 127.5 - 1.0).permute(2, 0, 1)[None]


def _pipeline(model):
    from diffusers import DDIMScheduler

    return FAMILY.pipeline(model, DDIMScheduler.from_config(model.schedule.scheduler_config))


def test_the_folder_brings_its_depth_estimator(model):
    state = model.family_state(SDState)
    assert type(state.depth_estimator).__name__ == "DPTForDepthEstimation"
    assert type(state.depth_processor).__name__.startswith("DPTImageProcessor")
    assert model.part("unet").config.in_channels == 5


def test_depth_map_is_the_pipelines(model):
    image = _picture(1)
    pipe = _pipeline(model)
    expected = pipe.prepare_depth_map(image, None, 1, False, torch.float32, torch.device("cpu"))
    ours = FAMILY.depth_maps(model, _pixels(image))
    assert ours.shape == expected.shape == (1, 1, 8, 8)
    assert torch.allclose(ours, expected, atol=1e-4)
    assert ours.amin().item() == pytest.approx(-1.0) and ours.amax().item() == pytest.approx(1.0)


def test_prediction_is_the_pipelines_unet_call_with_the_depth_channel(model):
    torch.manual_seed(0)
    latents = torch.randn(2, 4, 8, 8)
    depth = FAMILY.depth_maps(model, torch.cat([_pixels(_picture(2)), _pixels(_picture(3))]))
    conditioning = FAMILY.encode_text(model, ["a room", "a street"])
    timesteps = torch.tensor([10, 500])
    with torch.no_grad():
        ours = FAMILY.predict(model, latents, timesteps, conditioning, {DEPTH_EXTRA: depth}).output
        # What the pipeline's denoising loop does: the latents and the depth map along the channels.
        unet = _pipeline(model).unet
        expected = unet(torch.cat([latents, depth], dim=1), timesteps, conditioning.hidden_states).sample
    assert torch.equal(ours, expected)
    # The depth channel matters: another map, another prediction.
    with torch.no_grad():
        other = FAMILY.predict(model, latents, timesteps, conditioning, {DEPTH_EXTRA: -depth}).output
    assert not torch.allclose(ours, other)


def test_depth_maps_are_cached_with_the_latents(model):
    pixels = torch.cat([_pixels(_picture(4)), _pixels(_picture(5))])
    extras = FAMILY.cache_extras(model, pixels, None)
    assert set(extras) == {DEPTH_EXTRA}
    assert torch.equal(extras[DEPTH_EXTRA], FAMILY.depth_maps(model, pixels))


def test_normalised_per_image():
    depth = torch.stack([torch.linspace(0, 5, 64).reshape(8, 8), torch.full((8, 8), 3.0)])
    out = normalise_depth(depth, (4, 4))
    assert out.shape == (2, 1, 4, 4)
    assert out[0].amin().item() == pytest.approx(-1.0) and out[0].amax().item() == pytest.approx(1.0)
    assert torch.equal(out[1], torch.full((1, 4, 4), -1.0))  # flat: no division by zero


def test_a_model_of_another_kind_is_refused():
    with pytest.raises(ModelLoadError, match=r"not a depth model.*STABLE_DIFFUSION_20_DEPTH"):
        FAMILY.load(config(base_model_name="tiny:sd20-base"))
    with pytest.raises(ModelLoadError, match=r"is a depth model.*STABLE_DIFFUSION_20_BASE"):
        FAMILY.load(config(model_type="STABLE_DIFFUSION_20_BASE"))


def test_a_single_file_is_refused(tmp_path):
    path = tmp_path / "depth.safetensors"
    path.write_bytes(b"x")
    with pytest.raises(ModelLoadError, match="single file lacks its depth estimator"):
        FAMILY.load(config(base_model_name=str(path)))


def test_tiny_folder_loads_in_the_pipeline():
    from diffusers import StableDiffusionDepth2ImgPipeline

    pipe = StableDiffusionDepth2ImgPipeline.from_pretrained(str(tiny_model_dir("sd20-depth")))
    assert pipe.depth_estimator is not None and pipe.unet.config.in_channels == 5


def test_a_depth_file_stands_in_for_the_estimate_of_its_image(model):
    from onetrainer.families.base import BatchInputs

    pixels = torch.cat([_pixels(_picture(6)), _pixels(_picture(7))])
    ramp = torch.linspace(0, 255, 64).repeat(64, 1)[None]  # [1, H, W], as a file loads
    maps = FAMILY.depth_maps(model, pixels, [ramp, None])
    assert torch.allclose(maps[0], normalise_depth(ramp, (8, 8))[0])
    assert torch.allclose(maps[1], FAMILY.depth_maps(model, pixels[1:])[0])  # the estimator's for the other
    assert torch.equal(FAMILY.cache_extras(model, pixels, None, depths=[ramp, None])[DEPTH_EXTRA], maps)
    # uncached latents: the batch's pixels and depth files give the same
    no = torch.zeros(2, dtype=torch.bool)
    inputs = BatchInputs(torch.zeros(2, 4, 8, 8), pixels, [(64, 64)] * 2, [(0, 0)] * 2, None, no, depths=[ramp, None])
    assert torch.equal(FAMILY.batch_extras(model, inputs)[DEPTH_EXTRA], maps)
    # the memory estimate's stand-in (no pixels, nothing cached): a flat map of the latents' size
    inputs = BatchInputs(torch.zeros(2, 4, 8, 8), None, [(64, 64)] * 2, [(0, 0)] * 2, None, no)
    assert FAMILY.batch_extras(model, inputs)[DEPTH_EXTRA].shape == (2, 1, 8, 8)


def test_a_samples_base_image_applies_to_depth_models():
    from onetrainer.config import TrainConfig
    from onetrainer.config.enums import ModelType
    from onetrainer.config.sample_config import SampleConfig
    from onetrainer.config.validation import context_of

    meta = SampleConfig.spec("base_image_path").meta
    applies = {t: meta.applies(context_of(TrainConfig(model_type=t))) for t in ModelType if t.name.startswith("STAB")}
    assert applies[ModelType.STABLE_DIFFUSION_20_DEPTH] and applies[ModelType.STABLE_DIFFUSION_20_INPAINTING]
    assert not applies[ModelType.STABLE_DIFFUSION_20_BASE]
    assert not SampleConfig.spec("mask_image_path").meta.applies(
        context_of(TrainConfig(model_type=ModelType.STABLE_DIFFUSION_20_DEPTH))
    )


def test_a_single_file_is_written_in_the_original_layout_and_not_read_back(model, tmp_path):
    from safetensors.torch import load_file

    path = tmp_path / "depth.safetensors"
    FAMILY.save_single_file(model, path, torch.float32)
    # the original layout of 512-depth-ema.ckpt: five input channels; the estimator is no part of it
    assert load_file(str(path))["model.diffusion_model.input_blocks.0.0.weight"].shape[1] == 5
    with pytest.raises(ModelLoadError, match="lacks its depth estimator"):
        FAMILY.load(config(base_model_name=str(path)))
