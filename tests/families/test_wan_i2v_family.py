"""Wan 2.1 I2V on its tiny model (a tiny CLIP vision encoder beside Wan 2.1's tiny parts): the start image's
conditions (its latents after the mask channels, its CLIP states) and the prediction are WanImageToVideoPipeline's;
a folder of clips and a still trains a LoRA from the CLI, each clip's first frame its start image, the conditions
cached with its latents; the DIFFUSERS_LORA lands in `WanImageToVideoPipeline.load_lora_weights` on every module (the
image cross-attention's `add_k_proj` / `add_v_proj` included), as ours; COMFY_LORA / KOHYA_LORA name those `k_img` /
`v_img` and go through diffusers' converters to the same transformer; samples are clips from the sample's start image
(its reference image), the pipeline's; a fine-tune (conditions computed per batch) writes a folder that loads in
diffusers and back; a text-to-video folder and a sample without a start image are refused by name; LoKr (validated
on a clip held out), layer offloading with checkpointing and an embedding on UMT5 train."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

from onetrainer.families.loading import ModelLoadError
from onetrainer.families.wan import padded_text
from onetrainer.families.wan_i2v import start_image_conditions, start_mask
from onetrainer.sampling.clip import SampleClip
from onetrainer.tiny import tiny_model_dir
from tests.families.tiny_video_family import CLIP_SAMPLE, TinyVideoFamily
from tests.helpers import run_config, tiny_config

VARIANT = "wan21-i2v"


def transformer_output(transformer: torch.nn.Module) -> torch.Tensor:
    """Two clips of 2 latent frames of 4x6 (36 channels), 7 text tokens and 257 image states."""
    config = transformer.config
    generator = torch.Generator().manual_seed(0)
    latents = torch.randn(2, config.in_channels, 2, 4, 6, generator=generator)
    text = torch.randn(2, 7, config.text_dim, generator=generator)
    image = torch.randn(2, 257, config.image_dim, generator=generator)
    with torch.no_grad():
        return transformer(latents, torch.tensor([300.0, 800.0]), text, encoder_hidden_states_image=image,
                           return_dict=False)[0]  # fmt: skip


FAMILY = TinyVideoFamily(VARIANT, "WanImageToVideoPipeline", transformer_output)
our_model, pipeline = FAMILY.our_model, FAMILY.pipeline


def start_image(path: Path) -> Path:
    """A 64x48 start image: coloured halves."""
    image = Image.new("RGB", (64, 48), (30, 160, 220))
    image.paste((230, 200, 40), (0, 0, 32, 48))
    image.save(path)
    return path


def test_the_start_images_conditions_and_the_prediction_are_the_pipelines(tmp_path):
    family, model = our_model()
    pipe = pipeline()
    picture = Image.open(start_image(tmp_path / "start.png")).convert("RGB")
    first = torch.from_numpy(np.array(picture)).permute(2, 0, 1)[None].float() / 127.5 - 1
    clips = torch.cat([first[:, :, None], torch.rand(1, 3, 4, 48, 64) * 2 - 1], dim=2)  # 5 frames, the first ours
    with torch.no_grad():
        ours = start_image_conditions(model, clips)
        image = pipe.video_processor.preprocess(picture, height=48, width=64)
        _, theirs = pipe.prepare_latents(image, 1, 16, 48, 64, 5, torch.float32, torch.device("cpu"))
        assert ours["condition"].shape == (1, 16, 2, 6, 8)
        joined = torch.cat([start_mask(ours["condition"]), ours["condition"]], dim=1)  # the mask first, as there
        assert theirs.shape == joined.shape and torch.allclose(joined, theirs, atol=1e-5)
        embeds = pipe.encode_image(picture, torch.device("cpu"))
        assert ours["image_embeds"].shape == (1, 257, 32) and torch.allclose(ours["image_embeds"], embeds, atol=1e-5)
        still = start_image_conditions(model, first)  # a still is a one-frame clip, its own start image
        assert still["condition"].shape == (1, 16, 1, 6, 8)

        text = family.encode_text(model, ["a cat"])
        noisy, sigma = torch.randn(1, 16, 2, 6, 8), torch.tensor([0.4])
        predicted = family.predict(model, noisy, model.schedule.model_time(sigma), text, ours).output
        prompt = padded_text(text)  # WanPipeline's encode_prompt (test_wan_family.py)
        expected = pipe.transformer(torch.cat([noisy, theirs], dim=1), sigma * 1000, prompt,
                                    encoder_hidden_states_image=embeds, return_dict=False)[0]  # fmt: skip
    assert torch.allclose(predicted, expected, atol=1e-5)


def test_samples_are_clips_from_the_samples_start_image_as_the_pipelines(tmp_path):
    from onetrainer.config.sample_config import SampleConfig
    from onetrainer.sampling.sampler import render

    family, model = our_model()
    path = start_image(tmp_path / "start.png")
    sample = SampleConfig(prompt="a cat", negative_prompt="blur", width=64, height=48, frames=5, seed=3,
                          diffusion_steps=2, cfg_scale=4.0, reference_images=[str(path)])  # fmt: skip
    ours = render(family, model, sample)
    assert isinstance(ours, SampleClip) and len(ours.frames) == 5 and ours.fps == 16.0
    # the prompts as embeddings: WanPipeline's encode_prompt (test_wan_family.py); the I2V pipeline's own cleaning
    # needs ftfy, which diffusers imports only where it is installed
    output = pipeline()(
        image=Image.open(path).convert("RGB"), height=48, width=64, num_frames=5, num_inference_steps=2,
        guidance_scale=4.0, generator=torch.Generator().manual_seed(3), output_type="np",
        **family.prompt_arguments(model, "a cat", "blur"),
    )  # fmt: skip
    theirs = (np.clip(output.frames[0], 0, 1) * 255).round().astype(np.uint8)
    assert max(int(np.abs(np.asarray(f).astype(int) - t.astype(int)).max()) for f, t in zip(ours.frames, theirs)) <= 1
    with pytest.raises(ValueError, match="one start image, not 0"):
        render(family, model, SampleConfig(prompt="a cat", width=64, height=48, frames=5, diffusion_steps=1))


def test_a_sample_without_a_start_image_and_a_text_to_video_folder_are_refused():
    from onetrainer.config import config_from_dict

    data = tiny_config(Path("/nonexistent"), VARIANT, method="LORA", output_model_format="DIFFUSERS_LORA")
    _, problems = config_from_dict({**data, "samples": [{"prompt": "a cat", "frames": 5}]})
    assert any(p.path == "samples.0.reference_images" and "Wan 2.1 I2V" in p.message for p in problems)
    with pytest.raises(ModelLoadError, match="train it as WAN_2_1"):
        our_model(base_model_name=str(tiny_model_dir("wan21")))


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    """A DIFFUSERS_LORA on the blocks' attention and feed-forward (`attn-mlp`, the image cross-attention's
    projections included), from `scripts/train.py`'s main: two clips (5-frame windows) and a still, latents (with the
    start images' conditions) and captions cached, a sample from a start image."""
    root = tmp_path_factory.mktemp("wan-i2v-lora")
    start = str(start_image(root / "start.png"))
    sample = {**CLIP_SAMPLE, "negative_prompt": "blur", "cfg_scale": 3.0, "reference_images": [start]}
    return root, FAMILY.cli_lora_run(root, sample)


def test_clips_train_with_their_first_frames_conditions_cached(lora_run):
    entries = FAMILY.assert_clips_cached_and_sampled(*lora_run)  # the still, the windows; the sample clip
    assert all(e["extra/condition"].shape == e["latents"].shape for e in entries)  # [16, f, h, w] each
    assert all(e["extra/image_embeds"].shape == (257, 32) for e in entries)


def test_every_module_of_the_diffusers_lora_lands_in_the_i2v_pipeline_as_ours(lora_run):
    path, _, modules = FAMILY.diffusers_lora(lora_run[1])
    assert {"blocks.0.attn2.add_k_proj", "blocks.1.attn2.add_v_proj", "blocks.0.attn1.to_q"} <= modules
    assert len(modules) == 2 * 12  # per block: self- and cross-attention's q, k, v, o, the image k, v, the ffn's two
    FAMILY.assert_lora_lands_in_the_pipeline_as_ours(path, modules)


@pytest.mark.parametrize("fmt", ["COMFY_LORA", "KOHYA_LORA"])
def test_comfyui_and_musubi_layouts_name_the_image_projections_and_load_as_ours(lora_run, tmp_path, fmt):
    _, config = lora_run
    path = tmp_path / "lora.safetensors"
    state = FAMILY.save_lora_as(config, path, fmt)
    if fmt == "COMFY_LORA":
        assert {"diffusion_model.blocks.0.cross_attn.k_img.lora_down.weight",
                "diffusion_model.blocks.1.cross_attn.v_img.alpha",
                "diffusion_model.blocks.0.self_attn.q.lora_up.weight"} <= state.keys()  # fmt: skip
    else:
        assert {"lora_unet_blocks_0_cross_attn_k_img.lora_down.weight", "lora_unet_blocks_1_cross_attn_v_img.alpha",
                "lora_unet_blocks_1_ffn_2.lora_up.weight"} <= state.keys()  # fmt: skip
    FAMILY.assert_pipeline_reads_it_as_the_diffusers_lora(config, path, output_model_format=fmt)


def test_the_image_projection_has_comfyuis_names():
    from onetrainer.weights.wan_keys import original_module_path

    assert original_module_path("condition_embedder.image_embedder.ff.net.0.proj") == "img_emb.proj.1"
    assert original_module_path("condition_embedder.image_embedder.ff.net.2") == "img_emb.proj.3"
    assert original_module_path("blocks.3.attn2.add_k_proj") == "blocks.3.cross_attn.k_img"


def test_a_fine_tune_computes_the_conditions_per_batch_and_writes_an_i2v_folder(tmp_path):
    FAMILY.fine_tune_clips(tmp_path, latent_caching=False)
    frozen = ("text_encoder", "vae", "image_encoder")
    FAMILY.assert_fine_tune_round_trips(tmp_path / "out" / "model", *frozen)  # in diffusers and as a base model
    index = json.loads((tmp_path / "out" / "model" / "model_index.json").read_text())
    assert index["_class_name"] == "WanImageToVideoPipeline" and index["image_processor"][1].startswith(
        "CLIPImageProcessor"
    )


def test_lokr_trains_on_clips_with_the_image_projections_and_reads_back_as_trained(tmp_path, monkeypatch):
    """LoKr (a LyCORIS kind) over the attention (`attn-only`: the image cross-attention's projections included), in
    ComfyUI's names: read back into a fresh model it gives the trained transformer; it validates on the clip held out
    (its cached start-image conditions at fixed times)."""
    from onetrainer.training.events import Validated

    state, _, config, trained, events = FAMILY.train_clip_adapter(
        tmp_path, monkeypatch, "lokr", layer_filter_preset="attn-only", latent_caching=True, validation=True,
        validation_holdout=1, validate_after=1, validate_after_unit="EPOCH",
    )  # fmt: skip
    (validated,) = [e for e in events if isinstance(e, Validated)]
    assert torch.isfinite(torch.tensor(validated.loss))
    keys = {"diffusion_model.blocks.0.cross_attn.k_img.lokr_w1", "diffusion_model.blocks.1.self_attn.q.lokr_w1"}
    assert keys <= state.keys()
    FAMILY.assert_file_reads_back_as_trained(config, "lokr", trained, atol=1e-5)


def test_layer_offloading_with_checkpointing_trains_the_same_lora(tmp_path, monkeypatch):
    """Half of the transformer's blocks (their image cross-attention included) and UMT5's waiting off the device,
    gradient checkpointing on: the same losses and LoRA as without."""
    from tests.helpers import assert_offloading_trains_the_same_lora

    assert_offloading_trains_the_same_lora(
        tmp_path, monkeypatch, VARIANT, {"WanTransformer3DModel", "UMT5EncoderModel"}
    )


def test_an_embedding_trains_on_umt5_with_stills_as_their_own_start_images(tmp_path):
    """Textual inversion on UMT5 (stills train as one-frame clips whose start image is themselves): the file holds the
    vectors under `umt5`, and the run reads it back."""
    from tests.helpers import image_folder

    image_folder(tmp_path, count=2, placeholder="<shape>")
    config = tiny_config(tmp_path, variant=VARIANT, method="EMBEDDING", epochs=1)
    run_config(config)
    vectors = load_file(config["output_model_destination"])["umt5"]
    assert vectors.shape[-1] == 32 and torch.isfinite(vectors).all()
