"""SD 2.0 depth trained end to end on tiny:sd20-depth: depth maps from the files beside the images or estimated and
cached with the latents, a LoRA the depth pipeline loads, a fine-tune saved as a folder the pipeline loads (its depth
estimator included), and a sample rendered from a sample's base image."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from onetrainer.cli.train import main
from onetrainer.config import config_from_dict
from onetrainer.data.cache import read_entry
from onetrainer.data.training_data import EXTRA_PREFIX
from onetrainer.families.depth import DEPTH_EXTRA, normalise_depth
from onetrainer.families.sd import StableDiffusionFamily
from onetrainer.methods import create_method
from tests.helpers import image_folder, local_config, read_scalars, tiny_config, write_config

CPU = torch.device("cpu")
FAMILY = StableDiffusionFamily()


def _train(root, **overrides) -> dict:
    folder = image_folder(root, count=2)
    # One image with its depth map beside it (a left-to-right ramp), the other estimated by the model's DPT.
    first = sorted(p for p in folder.glob("*.png") if "masklabel" not in p.stem)[0]
    ramp = np.tile(np.linspace(0, 255, 72, dtype=np.float32), (72, 1)).astype(np.uint8)
    Image.fromarray(ramp).save(folder / f"{first.stem}-depth.png")
    config = tiny_config(root, variant="sd20-depth", epochs=1, **overrides)
    assert main(["--config-path", str(write_config(root, config))]) == 0
    return config


def _model(config: dict, **changes):
    cfg, problems = config_from_dict({**config, **changes})
    assert [p for p in problems if p.is_error] == []
    model = FAMILY.load(local_config(cfg))
    create_method(cfg, FAMILY, model, CPU)
    return model


def _latents(pipe, image: Image.Image) -> torch.Tensor:
    from diffusers import DDIMScheduler

    pipe.scheduler = DDIMScheduler.from_config(pipe.scheduler.config)
    pipe.set_progress_bar_config(disable=True)
    with torch.no_grad():
        return pipe(
            "a red circle", image=image, strength=1.0, num_inference_steps=2, guidance_scale=3.0,
            generator=torch.Generator().manual_seed(0), output_type="latent",
        ).images  # fmt: skip


def _input_image() -> Image.Image:
    rng = np.random.default_rng(3)
    return Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8))


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("depth-lora")
    config = _train(root, output_model_format="DIFFUSERS_LORA")
    return root, config


def test_lora_trains_with_the_depth_maps_cached(lora_run):
    root, _ = lora_run
    losses = [v for _, v in read_scalars(root / "workspace" / "tensorboard")["loss/train_step"]]
    assert losses and all(np.isfinite(losses))
    files = sorted((root / "cache" / "latents").rglob("*.safetensors"))
    depths = [read_entry(path)[EXTRA_PREFIX + DEPTH_EXTRA] for path in files]
    assert len(depths) == 2 and all(d.shape == (1, 8, 8) for d in depths)
    # the image with a depth file: its ramp at latent size (columns rising left to right, or mirrored); the other one
    # the estimator's: in [-1, 1] as well
    ramp = normalise_depth(torch.linspace(0, 255, 64).repeat(64, 1)[None], (8, 8))[0]
    assert any(torch.allclose(d, ramp, atol=0.05) or torch.allclose(d, ramp.flip(-1), atol=0.05) for d in depths)
    assert all(d.amin() == pytest.approx(-1.0) and d.amax() == pytest.approx(1.0) for d in depths)


def test_diffusers_lora_loads_in_the_depth_pipeline(lora_run):
    from diffusers import StableDiffusionDepth2ImgPipeline

    from onetrainer.tiny import tiny_model_dir

    root, config = lora_run
    path = root / "out" / "lora.safetensors"
    model = _model(config, lora_model_name=str(path))
    for part in model.parts.values():
        part.eval()
    from diffusers import DDIMScheduler

    ours = _latents(FAMILY.pipeline(model, DDIMScheduler.from_config(model.schedule.scheduler_config)), _input_image())
    pipe = StableDiffusionDepth2ImgPipeline.from_pretrained(str(tiny_model_dir("sd20-depth")))
    base = _latents(pipe, _input_image())
    pipe.load_lora_weights(str(path))
    theirs = _latents(pipe, _input_image())
    assert torch.allclose(ours, theirs, atol=1e-4)
    assert not torch.allclose(base, theirs, atol=1e-4)  # the LoRA changes the result


def test_fine_tune_saves_a_folder_the_depth_pipeline_loads(tmp_path):
    from diffusers import StableDiffusionDepth2ImgPipeline

    destination = tmp_path / "out" / "model"
    config = _train(
        tmp_path, method="FINE_TUNE", output_model_format="DIFFUSERS", output_model_destination=str(destination)
    )
    pipe = StableDiffusionDepth2ImgPipeline.from_pretrained(str(destination))
    assert pipe.depth_estimator is not None and pipe.feature_extractor is not None
    assert pipe.unet.config.in_channels == 5
    model = _model(config, base_model_name=str(destination), training_method="FINE_TUNE")
    trained = model.part("unet").state_dict()
    assert all(torch.equal(v, trained[k]) for k, v in pipe.unet.state_dict().items())
    assert torch.isfinite(_latents(pipe, _input_image())).all()


def test_a_sample_renders_from_its_base_image(tmp_path):
    from onetrainer.config.sample_config import SampleConfig
    from onetrainer.sampling.sampler import render

    image = tmp_path / "room.png"
    _input_image().save(image)
    cfg, _ = config_from_dict({"base_model_name": "tiny:sd20-depth", "model_type": "STABLE_DIFFUSION_20_DEPTH"})
    model = FAMILY.load(local_config(cfg))
    sample = SampleConfig(prompt="a room", width=64, height=64, diffusion_steps=2, base_image_path=str(image))
    picture = render(FAMILY, model, sample)
    assert picture.size == (64, 64)
    pixels = np.asarray(picture)
    assert pixels.min() < pixels.max()
    arguments = FAMILY.pipeline_arguments(model, sample, False)
    # the depth the sample is drawn on is the base image's, as training estimates it
    expected = FAMILY.depth_maps(model, torch.from_numpy(np.asarray(_input_image(), np.float32) / 127.5 - 1)
                                 .permute(2, 0, 1)[None])  # fmt: skip
    assert torch.equal(arguments["depth_map"], expected[:, 0]) and arguments["strength"] == 1.0


def test_without_a_latent_cache_each_step_reads_the_depth_files(tmp_path, monkeypatch):
    """Latent caching off: the batches carry their depth files to `batch_extras`, the image with one gets its map and
    the other the estimator's, and the run trains."""
    from onetrainer.families import sd

    seen = []
    real = sd.StableDiffusionFamily.depth_maps

    def spy(self, model, pixels, files=None):
        seen.append([f is not None for f in files] if files is not None else None)
        return real(self, model, pixels, files)

    monkeypatch.setattr(sd.StableDiffusionFamily, "depth_maps", spy)
    _train(tmp_path, latent_caching=False)
    assert not list((tmp_path / "cache").rglob("latents/**/*.safetensors"))
    assert seen and all(flags is not None and len(flags) == 2 for flags in seen)
    assert all(sorted(flags) == [False, True] for flags in seen)  # a batch of both images: one file, one estimate
