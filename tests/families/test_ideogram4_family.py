"""Ideogram 4 on its tiny model: the conditioning (13 of Qwen3-VL's layers through the chat template) equals
Ideogram4Pipeline's `encode_prompt`, the latents are what the pipeline decodes, the prediction is the transformer's
as the pipeline packs [text][image]; the text cache keeps each caption's tokens; a LoRA trained through the trainer
samples through the pipeline (both transformers) and its DIFFUSERS_LORA file loads in diffusers' `load_lora_weights`
(every module of it landing) as ours; a fine-tune's folder loads in diffusers and back as a base model."""

from __future__ import annotations

import math

import pytest
import torch
from PIL import Image
from safetensors import safe_open
from safetensors.torch import load_file

from onetrainer.families.ideogram4 import ResolutionShiftSchedule, pack
from tests.families.tiny_family import (
    ADAPTER_KINDS,
    SAMPLE,
    TinyFamily,
    assert_trained_and_sampled,
    lora_modules,
)

CAPTIONS = ["a red circle", "Two BLUE squares on a table "]


def transformer_output(transformer: torch.nn.Module) -> torch.Tensor:
    """Two rows of 2x3 latent tokens after a 5-token text block (the second caption 3 tokens, padded on the left)."""
    from diffusers import Ideogram4Pipeline

    config = transformer.config
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(2, 11, config.in_channels, generator=generator)
    text = torch.randn(2, 11, config.llm_features_dim, generator=generator)
    positions, segments, indicator = Ideogram4Pipeline._prepare_ids([5, 3], 2, 3, 5, "cpu")
    with torch.no_grad():
        return transformer(hidden, torch.tensor([0.3, 0.8]), text, positions, segments, indicator).sample[:, 5:]


FAMILY = TinyFamily("ideogram4", "Ideogram4Pipeline", transformer_output)
our_model, pipeline = FAMILY.our_model, FAMILY.pipeline


def pipeline_prediction(pipe, noisy_tokens: torch.Tensor, sigma: torch.Tensor, grid: tuple[int, int], prompts):
    """The transformer's output on the image tokens as the pipeline calls it (its text block of 2048 tokens, left-
    padded, the time 1 − σ)."""
    features, positions, segments, indicator = pipe.encode_prompt(prompts, grid[0], grid[1], 2048, "cpu")
    hidden = torch.cat([torch.zeros(len(prompts), 2048, noisy_tokens.shape[-1]), noisy_tokens], dim=1)
    output = pipe.transformer(
        hidden_states=hidden, timestep=1.0 - sigma, encoder_hidden_states=features, position_ids=positions,
        segment_ids=segments, indicator=indicator,
    ).sample  # fmt: skip
    return output[:, 2048:]


def test_the_conditioning_the_latents_and_the_prediction_are_the_pipelines():
    family, model = our_model()
    pipe = pipeline()
    with torch.no_grad():
        ours = family.encode_text(model, CAPTIONS)
        features, _, _, indicator = pipe.encode_prompt(list(CAPTIONS), 1, 1, 2048, "cpu")
        lengths = [int(n) for n in ours.tensors["attention_mask"].sum(dim=1)]
        assert ours.hidden_states.shape == (2, max(lengths), 13 * 32)  # 13 tapped layers of 32 side by side
        assert lengths == [int(n) for n in (indicator == 3).sum(dim=1)] and lengths[0] < lengths[1]
        for row, n in enumerate(lengths):  # the pipeline's tokens end where the image begins
            assert torch.allclose(ours.hidden_states[row, :n], features[row, 2048 - n : 2048], atol=1e-6)
            assert not ours.hidden_states[row, n:].any()

        pixels = torch.rand(2, 3, 64, 96) * 2 - 1
        latents = family.encode_images(model, pixels)
        vae = pipe.vae
        raw = vae.encode(pixels).latent_dist.mode()
        assert latents.shape == (2, 32, 8, 12)
        # what the pipeline's decode un-normalises and unpatches back to the VAE's latents
        tokens = pack(latents)
        std = torch.sqrt(vae.bn.running_var + vae.config.batch_norm_eps).view(1, 1, -1)
        z = (tokens * std + vae.bn.running_mean.view(1, 1, -1)).view(2, 4, 6, 2, 2, 32).permute(0, 5, 1, 3, 2, 4)
        assert torch.allclose(z.reshape(2, 32, 8, 12), raw, atol=1e-5)

        # σ·1000 from the schedule, 1 − σ into the transformer, the flow ε − x0 the negative of its output
        noisy, sigma = torch.randn(2, 32, 4, 6), torch.tensor([0.25, 0.75])
        predicted = family.predict(model, noisy, model.schedule.model_time(sigma), ours, {}).output
        theirs = pipeline_prediction(pipe, pack(noisy), sigma, (2, 3), list(CAPTIONS))
    assert torch.allclose(pack(predicted), -theirs, atol=1e-5)


def test_the_text_cache_keeps_each_captions_tokens_and_predicts_the_same():
    _, lengths = FAMILY.assert_cached_text_predicts_as_encoded(CAPTIONS, (2, 32, 2, 2))
    assert lengths[0] < lengths[1]


def test_the_dynamic_shift_is_the_pipelines_resolution_shift():
    from diffusers.pipelines.ideogram4.pipeline_ideogram4 import _resolution_aware_mu

    _, model = our_model()
    assert isinstance(model.schedule, ResolutionShiftSchedule)
    for h, w in ((64, 64), (128, 96), (32, 48)):
        mu = _resolution_aware_mu(height=8 * h, width=8 * w, base_mu=0.0)
        assert math.isclose(model.schedule.resolution_shift(h, w), math.exp(mu))
    assert math.isclose(model.schedule.resolution_shift(128, 128), 2.0)  # 1024 px: twice 512's side


def test_samples_pass_the_prompt_cut_to_its_tokens_and_the_cfg_scale_as_constant_guidance():
    from onetrainer.config.sample_config import SampleConfig

    family, model = our_model()
    arguments = family.pipeline_arguments(model, SampleConfig(cfg_scale=4.0), False)
    assert arguments == {"guidance_scale": 4.0, "guidance_schedule": None}
    assert family.pipeline_arguments(model, SampleConfig(cfg_scale=0.5), False)["guidance_scale"] == 1.0
    prompt = family.prompt_arguments(model, "a red circle", "blue")
    with torch.no_grad():
        encoded = family.encode_text(model, ["a red circle"])
    assert prompt == {"prompt": "a red circle", "max_sequence_length": encoded.hidden_states.shape[1]}


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    """A DIFFUSERS_LORA on OneTrainer's `attn-mlp` layers, its latents and captions cached, a sample with CFG."""
    root = tmp_path_factory.mktemp("ideogram4-lora")
    sample = {k: v for k, v in SAMPLE.items() if k != "negative_prompt"}  # the guidance's negative is its own model
    return root, *FAMILY.lora_run(root, {**sample, "cfg_scale": 3.0})


def test_a_lora_trains_caches_samples_and_every_module_lands_in_diffusers_as_ours(lora_run):
    root, config, events = lora_run
    assert_trained_and_sampled(events, root / "cache")
    state = load_file(config["output_model_destination"])
    modules = lora_modules(state)
    assert all(k.startswith("transformer.") for k in state)
    assert {"layers.0.attention.to_q", "layers.1.attention.to_out.0", "layers.1.feed_forward.w3"} <= modules
    assert not any(m.startswith(("input_proj", "llm_cond_proj", "t_embedding", "final_layer")) for m in modules)
    assert not any("adaln_modulation" in m for m in modules)

    pipe = pipeline()
    unconditional = transformer_output(pipe.unconditional_transformer)
    ours, _ = FAMILY.assert_lora_lands_in_the_pipeline_as_ours(config["output_model_destination"], modules, pipe)
    # the unconditional transformer trained nothing
    assert torch.equal(transformer_output(ours.part("unconditional_transformer")), unconditional)


def test_the_sampling_tool_renders_through_both_transformers_and_the_lora_changes_it(lora_run, tmp_path, monkeypatch):
    """scripts/sample.py on tiny:ideogram4: the pipeline calls the unconditional transformer once a step with CFG; a
    seed gives the same picture; the trained LoRA changes it."""
    import numpy as np
    from diffusers import Ideogram4Transformer2DModel

    from onetrainer.cli.sample import EXIT_OK, main

    _, config, _ = lora_run
    calls = []
    original = Ideogram4Transformer2DModel.forward

    def counted(self, *args, **kwargs):
        calls.append(kwargs["hidden_states"].shape[1])
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Ideogram4Transformer2DModel, "forward", counted)
    args = ["--model-type", "IDEOGRAM_4", "--base-model", "tiny:ideogram4", "--width", "96", "--height", "64",
            "--steps", "2", "--cfg-scale", "3", "--device", "cpu", "--prompt", "a red circle",
            "--seed", "3"]  # fmt: skip
    assert main([*args, "--output", str(tmp_path / "one.png")]) == EXIT_OK
    assert len(calls) == 4 and calls[1] == calls[3] == 4 * 6  # the unconditional pass: the 4x6 image tokens alone
    assert main([*args, "--output", str(tmp_path / "two.png")]) == EXIT_OK
    lora = ["--lora", config["output_model_destination"]]
    assert main([*args, *lora, "--output", str(tmp_path / "lora.png")]) == EXIT_OK
    one, two, with_lora = (np.asarray(Image.open(tmp_path / f"{n}.png")) for n in ("one", "two", "lora"))
    assert one.shape == (64, 96, 3) and np.array_equal(one, two) and not np.array_equal(one, with_lora)


def test_a_fine_tune_writes_a_folder_that_loads_in_diffusers_and_back(tmp_path):
    from diffusers import FlowMatchEulerDiscreteScheduler

    FAMILY.fine_tune(tmp_path)
    frozen = ("text_encoder", "vae", "unconditional_transformer")
    trained, _ = FAMILY.assert_fine_tune_round_trips(tmp_path / "out" / "model", *frozen)
    assert isinstance(trained.scheduler, FlowMatchEulerDiscreteScheduler)


def test_the_original_transformer_fuses_qkv_and_reads_back_as_the_transformers_model(tmp_path):
    """ORIGINAL_TRANSFORMER writes the original layout (`attention.qkv` = q, k, v stacked; `attention.o`), the rest in
    diffusers' names; `transformer.model_name` reads it back (and ComfyUI's prefix, and diffusers' names)."""

    from onetrainer.config.enums import ModelFormat

    family, model = FAMILY.changed_model()
    transformer = model.part("transformer")
    expected = transformer_output(transformer)
    path = tmp_path / "ideogram4.safetensors"
    family.save(model, ModelFormat.ORIGINAL_TRANSFORMER, path, torch.float32, None)
    state = load_file(str(path))
    with safe_open(str(path), "pt") as file:  # OneTrainer's name (resources/sd_model_spec/)
        assert file.metadata()["modelspec.architecture"] == "Ideogram"
    attention = transformer.layers[1].attention
    fused = torch.cat([attention.to_q.weight, attention.to_k.weight, attention.to_v.weight])
    assert torch.equal(state["layers.1.attention.qkv.weight"], fused)
    assert torch.equal(state["layers.1.attention.o.weight"], attention.to_out[0].weight)
    assert not any(".to_q." in k or ".to_out." in k for k in state)
    assert "llm_cond_proj.weight" in state and "final_layer.adaln_modulation.bias" in state
    diffusers_names = {k for k in transformer.state_dict() if ".attention.to_" not in k}
    assert diffusers_names <= set(state)
    FAMILY.assert_transformer_file_reads_back(path, expected)


def test_the_estimate_counts_the_released_model():
    """Ideogram 4's transformers (diffusers' default config, each about 9.5B) and Qwen3-VL-8B with its vision
    tower, as the bare Qwen3VLModel the pipeline loads (8.8B less its 0.6B LM head)."""
    from onetrainer.config.enums import ModelType
    from onetrainer.training.estimate import reference_shapes

    shapes = reference_shapes(ModelType.IDEOGRAM_4, "ideogram-ai/ideogram-v4")
    assert shapes["transformer"]["params"] == shapes["unconditional_transformer"]["params"]
    assert shapes["transformer"]["params"] == pytest.approx(9.5e9, rel=0.05)
    assert shapes["text_encoder"]["params"] == pytest.approx(8.15e9, rel=0.02)


@pytest.mark.parametrize("kind", ADAPTER_KINDS)
def test_kohya_files_write_lora_unet_names_and_read_back_as_trained(tmp_path, monkeypatch, kind):
    """KOHYA_LORA (OneTrainer's kohya layout: `lora_unet_` + the original path, q/k/v as one LoRA on `attention.qkv`;
    LoHa and LoKr keep them apart under `lora_transformer_` + the diffusers path; `lora_te1_` for Qwen3-VL's language
    model), in each adapter kind: read back into a fresh model it gives the trained transformer's output."""
    state, marker, config, trained = FAMILY.train_lora_file(tmp_path, monkeypatch, kind)
    q = "lora_unet_layers_0_attention_qkv" if kind == "lora" else "lora_transformer_layers_0_attention_to_q"
    assert f"{q}.{marker}" in state and f"lora_unet_layers_1_attention_o.{marker}" in state
    assert all(k.startswith(("lora_unet_layers_", "lora_transformer_layers_", "lora_te1_")) for k in state)
    te = any(k.startswith("lora_te1_language_model_layers_0_self_attn_q_proj.") for k in state)
    assert te is (kind == "lora")
    FAMILY.assert_file_reads_back_as_trained(config, kind, trained)


def test_a_comfy_lora_fuses_qkv_under_diffusion_model_and_every_module_lands_in_diffusers(tmp_path, monkeypatch):
    """COMFY_LORA (OneTrainer's LoRA presets' format): `diffusion_model.` + the original path, q/k/v one exact LoRA on
    `attention.qkv` (block-diagonal, alpha for its 3x rank), `attention.o`; diffusers' `load_lora_weights` converts it
    back onto every trained module (the blocks' AdaLN modulations too) and gives our output, as does our reading."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    state, _, config, trained = FAMILY.train_lora_file(
        tmp_path, monkeypatch, "lora", "COMFY_LORA", layer_filter_preset="blocks", text_encoder={"train": False}
    )
    assert all(k.startswith("diffusion_model.layers.") for k in state)
    rank = config["lora_rank"]
    assert state["diffusion_model.layers.0.attention.qkv.lora_down.weight"].shape[0] == 3 * rank
    assert float(state["diffusion_model.layers.0.attention.qkv.alpha"]) == 3 * config["lora_alpha"]
    assert "diffusion_model.layers.1.attention.o.lora_up.weight" in state
    assert "diffusion_model.layers.1.adaln_modulation.lora_up.weight" in state

    pipe = pipeline()
    pipe.load_lora_weights(config["output_model_destination"])
    landed = {name for name, m in pipe.transformer.named_modules() if isinstance(m, BaseTunerLayer)}
    expected = {f"layers.{i}.{m}" for i in (0, 1) for m in (
        "attention.to_q", "attention.to_k", "attention.to_v", "attention.to_out.0", "feed_forward.w1",
        "feed_forward.w2", "feed_forward.w3", "adaln_modulation")}  # fmt: skip
    assert landed == expected
    assert torch.allclose(transformer_output(pipe.transformer), trained["output"], atol=1e-5)
    FAMILY.assert_file_reads_back_as_trained(config, "lora", trained)


def test_an_embedding_trains_on_qwen3_vl_and_prompts_the_pipeline_as_ours(tmp_path):
    """The file holds the vectors under the text encoder's key; set into diffusers' tokenizer and encoder as new tokens
    (the pipeline has no textual-inversion loader), its `encode_prompt` gives our conditioning."""
    from tests.helpers import add_embedding_tokens

    tensors, family, model, method = FAMILY.trained_embedding(tmp_path)
    vectors = tensors["qwen3vl_8b"]
    pipe = pipeline()
    add_embedding_tokens(pipe, vectors)
    with torch.no_grad():
        ours = family.encode_text(model, [method.embeddings.apply("a photo of <shape>")])
        theirs, _, _, indicator = pipe.encode_prompt(["a photo of <shape> <shape>_1"], 1, 1, 2048, "cpu")
    n = int((indicator == 3).sum())
    assert ours.hidden_states.shape[1] == n
    assert torch.allclose(ours.hidden_states[0], theirs[0, 2048 - n : 2048], atol=1e-5)


def test_layer_offloading_trains_the_same_lora(tmp_path, monkeypatch):
    """Half of the transformer's blocks and of Qwen3-VL's decoder layers waiting off the device (`layer_blocks`), with
    gradient checkpointing as the presets train: the same losses and the same LoRA as without."""
    from tests.helpers import assert_offloading_trains_the_same_lora

    assert_offloading_trains_the_same_lora(
        tmp_path, monkeypatch, "ideogram4", {"Ideogram4Transformer2DModel", "Qwen3VLModel"}
    )


def test_a_dropped_caption_is_the_empty_captions_conditioning():
    """Caption dropout encodes the empty caption (the chat template around nothing)."""
    from onetrainer.families.base import CaptionDropout

    family, model = our_model()
    assert family.caption_dropout is CaptionDropout.EMPTY_CAPTION
    with torch.no_grad():
        empty = family.encode_text(model, [""])
        both = family.encode_text(model, ["", "a red circle"])
    n = int(empty.tensors["attention_mask"].sum())
    assert torch.allclose(both.hidden_states[0, :n], empty.hidden_states[0], atol=1e-6)


def test_without_the_unconditional_transformer_samples_guide_against_the_empty_caption(tmp_path):
    """`unconditional_transformer.include` off (OneTrainer's option): never loaded; the pipeline's negative branch is
    the trained transformer on the empty caption before the image tokens (what `predict` gives for ""), a sample
    renders, and a DIFFUSERS folder (which holds both transformers) is refused by name."""
    from diffusers import Ideogram4Pipeline

    from onetrainer.config.enums import ModelFormat
    from onetrainer.config.sample_config import SampleConfig

    family, model = our_model(unconditional_transformer={"include": False})
    assert "unconditional_transformer" not in model.parts
    pipe = family.pipeline(model, model.schedule.sampler(None))
    branch = pipe.unconditional_transformer
    noisy, sigma = torch.randn(2, 32, 4, 6), torch.tensor([0.25, 0.75])
    positions, segments, indicator = Ideogram4Pipeline._prepare_ids([1, 1], 2, 3, 1, "cpu")
    with torch.no_grad():
        empty = family.encode_text(model, ["", ""])
        expected = family.predict(model, noisy, model.schedule.model_time(sigma), empty, {}).output
        negative = branch(
            hidden_states=pack(noisy), timestep=1.0 - sigma, encoder_hidden_states=torch.zeros(2, 6, 13 * 32),
            position_ids=positions[:, 1:], segment_ids=segments[:, 1:], indicator=indicator[:, 1:], return_dict=False,
        )[0]  # fmt: skip
    assert torch.allclose(-negative, pack(expected), atol=1e-5)

    image = family.sample(
        model, SampleConfig(prompt="a red circle", width=64, height=64, diffusion_steps=2), str, False
    )
    assert image.size == (64, 64)
    with pytest.raises(ValueError, match=r"unconditional_transformer\.include"):
        family.save(model, ModelFormat.DIFFUSERS, tmp_path / "model", torch.float32, None)
    family.save(model, ModelFormat.ORIGINAL_TRANSFORMER, tmp_path / "t.safetensors", torch.float32, None)
    family.save_backup(model, tmp_path / "backup")
    assert torch.equal(
        family.backup_state(model, tmp_path / "backup", "transformer")["layers.0.attention.to_q.weight"],
        model.part("transformer").layers[0].attention.to_q.weight,
    )
