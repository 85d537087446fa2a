"""ERNIE-Image on its tiny model: the conditioning, the latents and the prediction are ErnieImagePipeline's, a LoRA
trained through the trainer samples and its DIFFUSERS_LORA file loads in diffusers' `load_lora_weights` (every module
of it landing) as ours, a fine-tune's folder loads in diffusers and back as a base model, KOHYA_LORA files read back
as trained in each adapter kind."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from onetrainer.families.ernie import BATCH_NORM_EPS, TEXT_TOKENS, caption_rows
from onetrainer.families.vae_batch_norm import patchify, unpatchify
from onetrainer.tiny import tiny_model_dir
from tests.families.tiny_family import ADAPTER_KINDS, TinyFamily, assert_trained_and_sampled, lora_modules
from tests.helpers import (
    assert_offloading_trains_the_same_lora,
)

CAPTIONS = ["a red circle", "Two BLUE squares on a table, seen from above"]


def transformer_output(transformer: torch.nn.Module) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    latents = torch.randn(2, transformer.config.in_channels, 2, 3, generator=generator)
    text = torch.randn(2, 7, transformer.config.text_in_dim, generator=generator)
    with torch.no_grad():
        return transformer(latents, torch.tensor([300.0, 800.0]), text, torch.tensor([7, 4])).sample


FAMILY = TinyFamily("ernie", "ErnieImagePipeline", transformer_output)
our_model, pipeline = FAMILY.our_model, FAMILY.pipeline


def test_the_conditioning_the_latents_and_the_prediction_are_the_pipelines():
    family, model = our_model()
    pipe = pipeline()
    with torch.no_grad():
        ours = family.encode_text(model, CAPTIONS)
        theirs = pipe.encode_prompt(list(CAPTIONS), "cpu")  # each prompt alone, unpadded
        rows = caption_rows(ours)
        assert [len(r) for r in rows] == [len(t) for t in theirs] and len(theirs[0]) < len(theirs[1])
        assert all(torch.allclose(r, t, atol=1e-6) for r, t in zip(rows, theirs))
        # the empty caption (caption dropout, the default negative prompt) is the start token alone, as the pipeline's
        (empty,) = pipe.encode_prompt("", "cpu")
        assert len(empty) == 1 and torch.allclose(caption_rows(family.encode_text(model, [""]))[0], empty, atol=1e-6)

        pixels = torch.rand(2, 3, 64, 96) * 2 - 1
        latents = family.encode_images(model, pixels)
        assert latents.shape == (2, 32, 8, 12)
        # what the pipeline decodes: its batch-norm denormalisation (epsilon 1e-5) of the patchified latents
        vae = pipe.vae
        mean = vae.bn.running_mean.view(1, -1, 1, 1)
        std = torch.sqrt(vae.bn.running_var.view(1, -1, 1, 1) + BATCH_NORM_EPS)
        raw = vae.encode(pixels).latent_dist.mode()
        assert torch.allclose(patchify(latents) * std + mean, pipe._patchify_latents(raw), atol=1e-5)
        assert torch.equal(patchify(latents), pipe._patchify_latents(unpatchify(patchify(latents))))

        # σ·1000 in, as the schedule gives it and the pipeline passes its timesteps; the flow out, patchified as the
        # pipeline's latents are
        noisy, sigma = torch.randn(2, 32, 4, 6), torch.tensor([0.25, 0.75])
        predicted = family.predict(model, noisy, model.schedule.model_time(sigma), ours, {}).output
        text, lengths = pipe._pad_text(theirs, "cpu", torch.float32, pipe.transformer.config.text_in_dim)
        raw = pipe.transformer(pipe._patchify_latents(noisy), sigma * 1000, text, lengths, return_dict=False)[0]
    assert torch.allclose(predicted, pipe._unpatchify_latents(raw), atol=1e-5)


def test_clip_skip_takes_an_earlier_hidden_state():
    family, model = our_model(text_encoder={"layer_skip": 1})
    _, plain = our_model()
    encoder = model.part("text_encoder")
    tokens = model.text_encoders[0].tokenizer(["a red circle"], return_tensors="pt")
    with torch.no_grad():
        skipped = family.encode_text(model, ["a red circle"]).hidden_states
        full = family.encode_text(plain, ["a red circle"]).hidden_states
        states = encoder(tokens.input_ids, output_hidden_states=True).hidden_states
    assert not torch.allclose(skipped, full, atol=1e-4)
    assert torch.allclose(states[-3], skipped, atol=1e-6) and torch.allclose(states[-2], full, atol=1e-6)


def test_captions_are_cut_at_512_tokens():
    family, model = our_model()
    with torch.no_grad():
        encoded = family.encode_text(model, ["circle " * 600, "a square"])
    assert encoded.hidden_states.shape[1] == TEXT_TOKENS
    assert encoded.tensors["attention_mask"].sum(dim=1).tolist() == [TEXT_TOKENS, 3]


def test_the_text_cache_keeps_each_captions_tokens_and_predicts_the_same():
    FAMILY.assert_cached_text_predicts_as_encoded(CAPTIONS, (2, 32, 4, 4))


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    """A DIFFUSERS_LORA on the blocks' attention and MLP (OneTrainer's `attn-mlp`), a sample with a negative prompt;
    latents and text cached."""
    return FAMILY.lora_run(tmp_path_factory.mktemp("ernie-lora"))


def test_a_lora_trains_samples_and_every_module_lands_in_diffusers_as_ours(lora_run):
    config, events = lora_run
    assert_trained_and_sampled(events, Path(config["cache_dir"]))
    state = load_file(config["output_model_destination"])
    modules = lora_modules(state)
    assert all(k.startswith("transformer.layers.") for k in state)
    assert {"layers.0.self_attention.to_q", "layers.1.self_attention.to_out.0", "layers.0.mlp.gate_proj",
            "layers.1.mlp.linear_fc2"} <= modules  # fmt: skip
    FAMILY.assert_lora_lands_in_the_pipeline_as_ours(config["output_model_destination"], modules)


def test_a_sample_is_the_pipelines_own_render_of_the_prompt(lora_run):
    """Our sample path (our prompt embeddings, the prompt enhancer off) renders what the pipeline renders from the
    prompt text itself."""
    import numpy as np

    from onetrainer.config.sample_config import SampleConfig
    from onetrainer.sampling.sampler import to_image

    family, model = our_model()
    sample = SampleConfig(prompt="a red circle", negative_prompt="blue", width=64, height=32, seed=3,
                          diffusion_steps=3, cfg_scale=4.0)  # fmt: skip
    with torch.no_grad():
        ours = np.asarray(family.sample(model, sample, lambda text: text, False))
        pipe = pipeline()
        theirs = pipe(
            prompt="a red circle", negative_prompt="blue", width=64, height=32, num_inference_steps=3,
            guidance_scale=4.0, generator=torch.Generator().manual_seed(3), output_type="np", use_pe=False,
        ).images[0]  # fmt: skip
    assert np.abs(ours.astype(int) - np.asarray(to_image(theirs)).astype(int)).max() <= 1


def test_a_fine_tune_writes_a_folder_that_loads_in_diffusers_and_back(tmp_path):
    FAMILY.fine_tune(tmp_path)
    trained, base = FAMILY.assert_fine_tune_round_trips(tmp_path / "out" / "model")
    assert dict(trained.scheduler.config) == dict(base.scheduler.config)


def test_an_original_transformer_file_reads_back_as_the_transformer_part(tmp_path):
    """ORIGINAL_TRANSFORMER (diffusers' names, as OneTrainer writes it) and the same file in ComfyUI's layout
    (`model.diffusion_model.` prefix) both load as `transformer.model_name`."""

    from onetrainer.config.enums import ModelFormat

    family, model = FAMILY.changed_model()
    path = tmp_path / "transformer.safetensors"
    family.save(model, ModelFormat.ORIGINAL_TRANSFORMER, path, torch.float32)
    expected = transformer_output(model.part("transformer"))
    FAMILY.assert_transformer_file_reads_back(path, expected)


@pytest.mark.parametrize("kind", ADAPTER_KINDS)
def test_kohya_files_write_unet_and_te_names_and_read_back_as_trained(tmp_path, monkeypatch, kind):
    """KOHYA_LORA (`lora_unet_` + the diffusers module path, `lora_te1_` for Ministral), in each adapter kind: read
    back into a fresh model it gives the trained transformer's output."""
    state, marker, config, trained = FAMILY.train_lora_file(tmp_path, monkeypatch, kind)
    assert f"lora_unet_layers_0_self_attention_to_q.{marker}" in state
    assert all(k.startswith("lora_unet_layers_") or k.startswith("lora_te1_language_model_layers_") for k in state)
    assert any(k.startswith("lora_te1_language_model_layers_0_self_attn_q_proj.") for k in state) is (kind == "lora")
    FAMILY.assert_file_reads_back_as_trained(config, kind, trained)


def test_a_fine_tune_backup_is_a_base_model_and_restores_every_part_whole(tmp_path):
    FAMILY.assert_backup_round_trips(tmp_path)


def test_the_estimate_counts_the_released_8b_transformer_and_ministral_3b():
    from onetrainer.config.enums import ModelType
    from onetrainer.training.estimate import reference_shapes

    shapes = reference_shapes(ModelType.ERNIE, "baidu/ERNIE-Image")
    assert shapes["transformer"]["params"] == pytest.approx(8.0e9, rel=0.03)
    assert shapes["text_encoder"]["params"] == pytest.approx(3.8e9, rel=0.06)  # Ministral 3 3B with its vision tower


def test_an_embedding_trains_on_ministral_and_prompts_the_pipeline_as_ours(tmp_path):
    """The file holds the vectors under `ministral3_3b` (ComfyUI's name of ERNIE-Image's text encoder); set into
    diffusers' tokenizer and encoder as new tokens, they give our conditioning."""
    from tests.helpers import add_embedding_tokens

    tensors, family, model, method = FAMILY.trained_embedding(tmp_path)
    vectors = tensors["ministral3_3b"]
    pipe = pipeline()
    add_embedding_tokens(pipe, vectors)
    with torch.no_grad():
        ours = caption_rows(family.encode_text(model, [method.embeddings.apply("a photo of <shape>")]))[0]
        (theirs,) = pipe.encode_prompt(["a photo of <shape> <shape>_1"], "cpu")
    assert ours.shape == theirs.shape and torch.allclose(ours, theirs, atol=1e-5)


def test_a_dropped_caption_is_the_empty_captions_start_token():
    """Caption dropout encodes the empty caption (what the pipeline's default negative prompt is): the dropped row is
    the start token's states alone, the kept row its caption's."""
    family, model = our_model()
    encode = lambda captions: family.encode_text(model, captions)  # noqa: E731
    with torch.no_grad():
        dropped = family.drop_captions(model, CAPTIONS, [torch.tensor([True, False])], encode)
        empty, kept = encode([""]), encode(CAPTIONS[1:])
    rows = caption_rows(dropped)
    assert torch.allclose(rows[0], caption_rows(empty)[0], atol=1e-6) and len(rows[0]) == 1
    assert torch.allclose(rows[1], caption_rows(kept)[0], atol=1e-6)


def test_text_encoder_loras_go_on_ministrals_decoder_layers_not_the_vision_tower():
    family, model = our_model()
    targets = family.lora_targets(model, "text_encoder", [], False)
    assert targets and all(t.startswith("language_model.layers.") for t in targets)
    assert family.metadata_kind(model).architecture == "ernie-image"
    assert model.text_encoders[0].embedding_key == "ministral3_3b"


def test_layer_offloading_trains_the_same_lora(tmp_path, monkeypatch):
    """Half of the transformer's blocks and of Ministral's layers waiting off the device (`layer_blocks`), with
    gradient checkpointing as the presets train: the same losses and the same LoRA as without."""
    assert_offloading_trains_the_same_lora(
        tmp_path, monkeypatch, "ernie", {"ErnieImageTransformer2DModel", "Mistral3Model"}
    )


@pytest.mark.parametrize("kind", ["lora", "lokr"])
def test_comfy_files_write_comfyuis_names_and_read_back_as_trained(tmp_path, monkeypatch, kind):
    """COMFY_LORA: the transformer's adapters under `diffusion_model.<diffusers module>` (ComfyUI's ERNIE model has
    diffusers' module paths), Ministral's under `text_encoders.ministral3_3b.transformer.model.<decoder module>`; read
    back into a fresh model they give the trained transformer's output."""
    state, marker, config, trained = FAMILY.train_lora_file(tmp_path, monkeypatch, kind, "COMFY_LORA")
    assert f"diffusion_model.layers.0.self_attention.to_q.{marker}" in state
    te = "text_encoders.ministral3_3b.transformer.model.layers."
    assert all(k.startswith("diffusion_model.layers.") or k.startswith(te) for k in state)
    assert any(k.startswith(te + "0.self_attn.q_proj.") for k in state) is (kind == "lora")
    FAMILY.assert_file_reads_back_as_trained(config, kind, trained)


def test_lora_tool_extracts_a_fine_tunes_changes_and_merges_them_back(tmp_path):
    """`scripts/lora_tool.py extract` on an ERNIE-Image folder whose attention and MLP changed by a rank-2 amount gives
    a KOHYA_LORA of those two layers; merged into the base it gives the changed weights back."""
    import shutil

    from diffusers import ErnieImageTransformer2DModel

    from onetrainer.cli.lora_tool import main as lora_tool

    tuned = tmp_path / "tuned"
    shutil.copytree(tiny_model_dir("ernie"), tuned)
    transformer = ErnieImageTransformer2DModel.from_pretrained(str(tuned), subfolder="transformer")
    changed = ["layers.0.self_attention.to_q", "layers.1.mlp.up_proj"]
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name in changed:
            weight = transformer.get_submodule(name).weight
            low_rank = torch.randn(weight.shape[0], 2, generator=generator) @ torch.randn(
                2, weight.shape[1], generator=generator
            )
            weight += 0.05 * low_rank
    transformer.save_pretrained(str(tuned / "transformer"))
    lora, merged = tmp_path / "extracted.safetensors", tmp_path / "merged"
    common = ["--model-type", "ERNIE", "--base-model-name", "tiny:ernie", "--output-dtype", "FLOAT_32"]
    assert lora_tool(["extract", *common, "--input-name", str(tuned), "--rank", "2",
                      "--output-model-destination", str(lora)]) == 0  # fmt: skip
    modules = {k.partition(".")[0] for k in load_file(str(lora))}
    assert modules == {"lora_unet_" + name.replace(".", "_") for name in changed}
    assert lora_tool(["merge", *common, "--lora", str(lora), "--output-model-format", "DIFFUSERS",
                      "--output-model-destination", str(merged)]) == 0  # fmt: skip
    again = ErnieImageTransformer2DModel.from_pretrained(str(merged), subfolder="transformer")
    ours, theirs = again.state_dict(), transformer.state_dict()
    assert all(torch.allclose(ours[k], theirs[k], atol=1e-5) for k in theirs)


def test_the_dynamic_training_shift_is_onetrainers_on_the_vaes_latents():
    """`dynamic_timestep_shifting` shifts by e^μ, μ linear in the 2x2 patches of the VAE's latents between the
    scheduler config's (256, 0.5) and (4096, 1.15), as OneTrainer's `calculate_timestep_shift` computes it from the
    unpatchified latents' size; the pipeline's own sampling shift is the scheduler's."""
    import math

    _, model = our_model()
    config = model.schedule.scheduler_config
    for height, width in ((64, 64), (128, 96)):  # 512 px and 1024 x 768 px
        tokens = (height // 2) * (width // 2)
        base, most = config["base_image_seq_len"], config["max_image_seq_len"]
        slope = (config["max_shift"] - config["base_shift"]) / (most - base)
        mu = tokens * slope + config["base_shift"] - slope * base
        assert model.schedule.resolution_shift(height, width) == pytest.approx(math.exp(mu))


def test_turbo_samples_in_8_steps_without_cfg_and_the_base_model_as_its_type_says():
    import dataclasses

    family, model = our_model()
    assert family.sample_defaults(model) == model.type_info.sample
    assert (model.type_info.sample.diffusion_steps, model.type_info.sample.cfg_scale) == (50, 4.0)
    turbo = family.sample_defaults(dataclasses.replace(model, source="baidu/ERNIE-Image-Turbo"))
    assert (turbo.diffusion_steps, turbo.cfg_scale) == (8, 1.0)
