"""Wan 2.1 on its tiny model, the first video family: the conditioning (UMT5 through the pipeline's cleaning, zeros to
512 tokens), the 5-D latents of clips and the prediction are WanPipeline's; the text cache keeps each caption's tokens;
a folder of clips and a still trains a LoRA from the CLI (`scripts/train.py`'s main), its clips' latents cached 5-D,
and the DIFFUSERS_LORA file loads in `WanPipeline.load_lora_weights` with every module landing, as ours; the same
adapters as COMFY_LORA (ComfyUI's `diffusion_model.` + Wan's names) and KOHYA_LORA (musubi-tuner's `lora_unet_`) go
through diffusers' converters to the same transformer; samples are clips of the sample's frames; LoHa and LoKr
train; layer offloading with checkpointing, 8-bit weights, a clip's mask and validation work on 5-D latents; the
estimate counts frames; an embedding trains on UMT5; a fine-tune writes a folder that loads in diffusers and back.
The clips are written here with PyAV."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

from onetrainer.families.wan import TEXT_TOKENS, WanState
from onetrainer.sampling.clip import SampleClip
from tests.families.tiny_video_family import CLIP_SAMPLE, TinyVideoFamily, assert_clip_has
from tests.helpers import run_config

CAPTIONS = ["a red  circle &amp; a cat", "Two BLUE squares on a table "]


def transformer_output(transformer: torch.nn.Module) -> torch.Tensor:
    """Two clips of 2 latent frames of 4x6 and 7 text tokens."""
    config = transformer.config
    generator = torch.Generator().manual_seed(0)
    latents = torch.randn(2, config.in_channels, 2, 4, 6, generator=generator)
    text = torch.randn(2, 7, config.text_dim, generator=generator)
    with torch.no_grad():
        return transformer(latents, torch.tensor([300.0, 800.0]), text, return_dict=False)[0]


FAMILY = TinyVideoFamily("wan21", "WanPipeline", transformer_output)
our_model, pipeline = FAMILY.our_model, FAMILY.pipeline


def test_the_conditioning_the_latents_and_the_prediction_are_the_pipelines():
    family, model = our_model()
    pipe = pipeline()
    with torch.no_grad():
        ours = family.encode_text(model, CAPTIONS)
        embeds, _ = pipe.encode_prompt(list(CAPTIONS), do_classifier_free_guidance=False, max_sequence_length=512)
        assert ours.hidden_states.shape == (2, TEXT_TOKENS, 32)
        assert torch.equal(ours.hidden_states, embeds)  # cleaned as the pipeline cleans, zeros after the tokens
        lengths = ours.tensors["attention_mask"].sum(dim=1)
        assert 0 < int(lengths[0]) < TEXT_TOKENS and not ours.hidden_states[0, int(lengths[0]) :].any()

        clips = torch.rand(2, 3, 5, 48, 64) * 2 - 1
        latents = family.encode_images(model, clips)
        raw = pipe.vae.encode(clips).latent_dist.mode()
        mean = torch.tensor(pipe.vae.config.latents_mean).view(1, -1, 1, 1, 1)
        std = torch.tensor(pipe.vae.config.latents_std).view(1, -1, 1, 1, 1)
        assert latents.shape == (2, 16, 2, 6, 8)  # 5 frames → 1 + 1 latent frames, 8x spatial
        assert torch.allclose(latents, (raw - mean) / std, atol=1e-6)  # what the pipeline decodes back
        still = family.encode_images(model, clips[:, :, 0])  # a still is a one-frame clip
        assert still.shape == (2, 16, 1, 6, 8)

        sigma = torch.tensor([0.25, 0.75])
        noisy = torch.randn(2, 16, 2, 6, 8)
        predicted = family.predict(model, noisy, model.schedule.model_time(sigma), ours, {}).output
        theirs = pipe.transformer(noisy, sigma * 1000, embeds, return_dict=False)[0]
    assert torch.allclose(predicted, theirs, atol=1e-5)


def test_the_text_cache_keeps_each_captions_tokens_and_predicts_the_same():
    _, lengths = FAMILY.assert_cached_text_predicts_as_encoded(CAPTIONS, (2, 16, 1, 2, 2))
    assert lengths[0] != lengths[1]


def test_samples_are_clips_of_the_samples_frames_through_the_models_own_sampler():
    from diffusers import UniPCMultistepScheduler

    from onetrainer.config.sample_config import SampleConfig
    from onetrainer.sampling.sampler import render

    family, model = our_model()
    assert model.family_state(WanState).sampler_config["flow_shift"] == 3.0
    assert isinstance(family.own_sampler(model), UniPCMultistepScheduler)
    for frames, expected in ((6, 5), (1, 1)):  # 4k + 1, rounded down
        sample = SampleConfig(prompt="a cat", negative_prompt="blur", width=64, height=48, frames=frames, seed=3,
                              diffusion_steps=2, cfg_scale=4.0)  # fmt: skip
        clip = render(family, model, sample)
        assert isinstance(clip, SampleClip) and len(clip.frames) == expected and clip.fps == 16.0
        assert all(frame.size == (64, 48) for frame in clip.frames)
    import numpy as np

    pipe = pipeline()
    settings = {"negative_prompt": "blur", "height": 48, "width": 64, "num_inference_steps": 2, "guidance_scale": 4.0}
    output = pipe(
        prompt="a cat", num_frames=5, generator=torch.Generator().manual_seed(3), output_type="np", **settings
    )
    sample = SampleConfig(prompt="a cat", negative_prompt="blur", width=64, height=48, frames=5, seed=3,
                          diffusion_steps=2, cfg_scale=4.0)  # fmt: skip
    ours = render(family, model, sample)

    theirs = (np.clip(output.frames[0], 0, 1) * 255).round().astype(np.uint8)
    assert max(int(np.abs(np.asarray(f).astype(int) - t.astype(int)).max()) for f, t in zip(ours.frames, theirs)) <= 1


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    """A DIFFUSERS_LORA on the blocks' attention and feed-forward (`attn-mlp`), from `scripts/train.py`'s main with a
    config file: a folder of two clips (5-frame windows) and a still, latents and captions cached, masked training
    (no mask files: each clip trains whole), a sample."""
    root = tmp_path_factory.mktemp("wan-lora")
    sample = {**CLIP_SAMPLE, "negative_prompt": "blur", "cfg_scale": 3.0}
    return root, FAMILY.cli_lora_run(root, sample, masked_training=True)


def test_clips_and_a_still_train_from_the_cli_with_5d_latents_cached(lora_run):
    FAMILY.assert_clips_cached_and_sampled(*lora_run)


def test_every_module_of_the_diffusers_lora_lands_in_the_pipeline_as_ours(lora_run):
    path, _, modules = FAMILY.diffusers_lora(lora_run[1])
    assert {
        "blocks.0.attn1.to_q",
        "blocks.1.attn2.to_out.0",
        "blocks.1.ffn.net.0.proj",
        "blocks.0.ffn.net.2",
    } <= modules
    assert len(modules) == 2 * 10  # per block: self- and cross-attention's q, k, v, o and the feed-forward's two
    FAMILY.assert_lora_lands_in_the_pipeline_as_ours(path, modules)


@pytest.mark.parametrize("fmt", ["COMFY_LORA", "KOHYA_LORA"])
def test_comfyui_and_musubi_layouts_load_through_diffusers_converters_as_ours(lora_run, tmp_path, fmt):
    """The trained adapters written as ComfyUI's (`diffusion_model.blocks.N.self_attn.q`) or musubi-tuner's
    (`lora_unet_blocks_N_self_attn_q`) layout: diffusers' converters give the same transformer, and ours reads the file
    back."""
    _, config = lora_run
    path = tmp_path / "lora.safetensors"
    state = FAMILY.save_lora_as(config, path, fmt)
    if fmt == "COMFY_LORA":
        assert {"diffusion_model.blocks.0.self_attn.q.lora_down.weight", "diffusion_model.blocks.1.cross_attn.o.alpha",
                "diffusion_model.blocks.1.ffn.0.lora_up.weight"} <= state.keys()  # fmt: skip
    else:
        assert {"lora_unet_blocks_0_self_attn_q.lora_down.weight", "lora_unet_blocks_1_cross_attn_o.alpha",
                "lora_unet_blocks_1_ffn_2.lora_up.weight"} <= state.keys()  # fmt: skip

    FAMILY.assert_pipeline_reads_it_as_the_diffusers_lora(config, path)


@pytest.mark.parametrize("kind", ["loha", "lokr"])
def test_lycoris_kinds_train_on_clips_and_read_back_as_trained(tmp_path, monkeypatch, kind):
    """LoHa and LoKr (LyCORIS kinds) in ComfyUI's names (`diffusion_model.` + Wan's module paths); read back into a
    fresh model they give the trained transformer."""
    state, marker, config, trained, _ = FAMILY.train_clip_adapter(
        tmp_path, monkeypatch, kind, layer_filter_preset="attn-only"
    )
    assert f"diffusion_model.blocks.0.self_attn.q.{marker}" in state
    assert all(k.startswith("diffusion_model.blocks.") for k in state)
    FAMILY.assert_file_reads_back_as_trained(config, kind, trained, atol=1e-5)


def test_a_fine_tune_writes_a_folder_that_loads_in_diffusers_and_back(tmp_path):
    from diffusers import UniPCMultistepScheduler

    FAMILY.fine_tune_clips(tmp_path)
    trained, _ = FAMILY.assert_fine_tune_round_trips(tmp_path / "out" / "model")  # in diffusers and as a base model
    assert isinstance(trained.scheduler, UniPCMultistepScheduler)  # the model's own sampler travels
    assert json.loads((tmp_path / "out" / "model" / "model_index.json").read_text())["_class_name"] == "WanPipeline"


def test_layer_offloading_with_checkpointing_trains_the_same_lora(tmp_path, monkeypatch):
    """Half of the transformer's blocks and UMT5's waiting off the device, gradient checkpointing on: the same losses
    and LoRA as without (stills as one-frame clips, their latents 5-D)."""
    from tests.helpers import assert_offloading_trains_the_same_lora

    assert_offloading_trains_the_same_lora(
        tmp_path, monkeypatch, "wan21", {"WanTransformer3DModel", "UMT5EncoderModel"}
    )


def test_clips_train_with_8_bit_weights_and_a_clip_mask(tmp_path):
    """A LoRA over a float8 transformer and an int8 UMT5, on clips, one of them with a mask (one `-masklabel.png` for
    the whole clip, weighing every latent frame): it trains (finite losses), validates on the file held out (its 5-D
    latents at fixed times) and writes its file."""
    from onetrainer.training.events import Metrics, Validated

    config = FAMILY.clip_config(
        tmp_path, "LORA", epochs=1, learning_rate=1e-2, output_model_format="DIFFUSERS_LORA",
        layer_filter_preset="attn-only", masked_training=True, unmasked_probability=0.0,
        transformer={"weight_dtype": "FLOAT_8"}, text_encoder={"train": False, "weight_dtype": "INT_8"},
        validation=True, validation_holdout=1, validate_after=1, validate_after_unit="EPOCH",
    )  # fmt: skip
    mask = Image.new("L", (64, 48), 0)
    mask.paste(255, (0, 0, 32, 48))
    mask.save(Path(config["concepts"][0]["path"]) / "walk-masklabel.png")
    events = run_config(config)
    losses = [e.loss for e in events if isinstance(e, Metrics)]
    assert losses and all(torch.isfinite(torch.tensor(losses)))
    (validated,) = [e for e in events if isinstance(e, Validated)]
    assert torch.isfinite(torch.tensor(validated.loss))
    assert any(k.startswith("transformer.blocks.0.attn1.") for k in load_file(config["output_model_destination"]))


def test_the_estimate_counts_the_clips_frames():
    """The measured activations of one sample grow with the run's frames (25 frames: 7 latent frames of a 480 px
    clip); a frame count the VAE does not take is rounded down."""
    from onetrainer.config import config_from_dict
    from onetrainer.training.estimate import clip_frames, measure_activations, reference_shapes

    measured = {}
    for frames in ("1", "25", "27"):
        config, _ = config_from_dict({"model_type": "WAN_2_1", "base_model_name": "Wan-AI/Wan2.1-T2V-1.3B-Diffusers",
                                      "training_method": "LORA", "resolution": "480", "frames": frames})  # fmt: skip
        measured[frames] = (clip_frames(config), measure_activations(config, reference_shapes(config.model_type)))
    assert [measured[f][0] for f in ("1", "25", "27")] == [(1, 1), (25, 7), (25, 7)]
    assert "3600 latent tokens" in measured["1"][1].source and "25200 latent tokens" in measured["25"][1].source
    assert measured["25"][1].kept > 5 * measured["1"][1].kept


def test_an_embedding_trains_on_umt5_and_prompts_the_pipeline_as_ours(tmp_path):
    """The file holds the vectors under `umt5`; set into diffusers' tokenizer and encoder as new tokens (the pipeline
    has no textual-inversion loader), they give our conditioning (stills train as one-frame clips)."""
    from tests.helpers import add_embedding_tokens

    file, family, model, method = FAMILY.trained_embedding(tmp_path)  # the run continues from the file
    vectors = file["umt5"]
    pipe = pipeline()
    add_embedding_tokens(pipe, vectors)
    with torch.no_grad():
        ours = family.encode_text(model, [method.embeddings.apply("a photo of <shape>")]).hidden_states
        theirs = pipe.encode_prompt(["a photo of <shape> <shape>_1"], do_classifier_free_guidance=False,
                                    max_sequence_length=512)[0]  # fmt: skip
    assert ours.shape == theirs.shape and torch.allclose(ours, theirs, atol=1e-5)


def test_scripts_sample_writes_a_clip(tmp_path):
    """`scripts/sample.py` renders through the same `render`: a video sample is written as a clip, here a GIF named
    by the output's suffix, of the frames asked."""
    from onetrainer.cli.sample import EXIT_OK, main

    output = tmp_path / "cat.gif"
    argv = ["--model-type", "WAN_2_1", "--base-model", "tiny:wan21", "--prompt", "a cat", "--width", "64",
            "--height", "48", "--steps", "2", "--frames", "5", "--output", str(output)]  # fmt: skip
    assert main(argv) == EXIT_OK
    assert_clip_has(output)
