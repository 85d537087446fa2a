"""Sana on its tiny model: the conditioning, the latents and the prediction are SanaPipeline's, a LoRA trained through
the trainer samples and its DIFFUSERS_LORA file loads in diffusers' `load_lora_weights` (every module of it landing)
as ours, a fine-tune's folder loads in diffusers and back as a base model, an embedding prompts the pipeline as
ours."""

from __future__ import annotations

import inspect

import pytest
import torch
from safetensors.torch import load_file

from onetrainer.families.sana import COMPLEX_HUMAN_INSTRUCTION, TEXT_TOKENS
from onetrainer.tiny import tiny_model_dir
from tests.families.tiny_family import ADAPTER_KINDS, TinyFamily, assert_trained_and_sampled, lora_modules
from tests.helpers import (
    add_embedding_tokens,
    assert_offloading_trains_the_same_lora,
)

CAPTIONS = ["a red circle", "Two BLUE squares on a table "]


def pipeline_instruction() -> list[str]:
    from diffusers import SanaPipeline

    return inspect.signature(SanaPipeline.__call__).parameters["complex_human_instruction"].default


def transformer_output(transformer: torch.nn.Module) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    latents = torch.randn(2, transformer.config.in_channels, 3, 2, generator=generator)
    text = torch.randn(2, 7, transformer.config.caption_channels, generator=generator)
    mask = torch.tensor([[1] * 7, [1] * 4 + [0] * 3])
    with torch.no_grad():
        return transformer(latents, text, torch.tensor([300.0, 800.0]), encoder_attention_mask=mask).sample


FAMILY = TinyFamily("sana", "SanaPipeline", transformer_output)
our_model, pipeline = FAMILY.our_model, FAMILY.pipeline


def test_the_conditioning_the_latents_and_the_prediction_are_the_pipelines():
    family, model = our_model()
    pipe = pipeline()
    assert list(COMPLEX_HUMAN_INSTRUCTION) == pipeline_instruction()  # what __call__ prompts with
    with torch.no_grad():
        ours = family.encode_text(model, CAPTIONS)
        embeds, mask, negative, negative_mask = pipe.encode_prompt(
            list(CAPTIONS), True, negative_prompt="", complex_human_instruction=pipeline_instruction()
        )
        assert ours.hidden_states.shape[1] == TEXT_TOKENS
        assert torch.equal(ours.hidden_states, embeds) and torch.equal(ours.tensors["attention_mask"], mask)
        # samples prompt the negative side as the pipeline does, without the instruction
        arguments = family.prompt_arguments(model, "a red circle", None)
        assert torch.equal(arguments["negative_prompt_embeds"], negative[:1])
        assert torch.equal(arguments["negative_prompt_attention_mask"], negative_mask[:1])

        pixels = torch.rand(2, 3, 64, 96) * 2 - 1
        latents = family.encode_images(model, pixels)
        assert latents.shape == (2, 32, 2, 3)
        assert torch.equal(latents, pipe.vae.encode(pixels).latent * pipe.vae.config.scaling_factor)

        # σ·1000 in, as the schedule gives it and the pipeline passes its timesteps; the flow out
        noisy, sigma = torch.randn(2, 32, 2, 3), torch.tensor([0.25, 0.75])
        predicted = family.predict(model, noisy, model.schedule.model_time(sigma), ours, {}).output
        theirs = pipe.transformer(noisy, embeds, sigma * 1000, encoder_attention_mask=mask).sample
    assert torch.equal(predicted, theirs)


def test_clip_skip_takes_an_earlier_layer_through_gemmas_final_norm():
    family, model = our_model(text_encoder={"layer_skip": 1})
    _, plain = our_model()
    encoder = model.part("text_encoder")
    tokens = model.text_encoders[0].tokenizer(["a red circle"], return_tensors="pt")
    with torch.no_grad():
        skipped = family.encode_text(model, ["a red circle"]).hidden_states
        full = family.encode_text(plain, ["a red circle"]).hidden_states
        states = encoder(tokens.input_ids, output_hidden_states=True).hidden_states
    assert not torch.allclose(skipped, full, atol=1e-4)
    assert torch.allclose(encoder.norm(states[-2])[0, 0], skipped[0, 0], atol=1e-6)  # the start token's state


def test_the_text_cache_keeps_each_captions_tokens_and_predicts_the_same():
    FAMILY.assert_cached_text_predicts_as_encoded(CAPTIONS, (2, 32, 2, 2))


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    """A DIFFUSERS_LORA on the blocks' attention and feed-forward (OneTrainer's `attn-mlp`: linear layers and the 1x1
    convolutions), a sample with a negative prompt."""
    return FAMILY.lora_run(tmp_path_factory.mktemp("sana-lora"))


def test_a_lora_trains_samples_and_every_module_lands_in_diffusers_as_ours(lora_run):
    config, events = lora_run
    assert_trained_and_sampled(events)
    state = load_file(config["output_model_destination"])
    modules = lora_modules(state)
    assert all(k.startswith("transformer.transformer_blocks.") for k in state)
    assert {"transformer_blocks.0.attn1.to_q", "transformer_blocks.1.attn2.to_out.0",
            "transformer_blocks.0.ff.conv_inverted", "transformer_blocks.1.ff.conv_point"} <= modules  # fmt: skip
    assert not any("conv_depth" in m for m in modules)  # the depthwise convolution is grouped: no LoRA
    FAMILY.assert_lora_lands_in_the_pipeline_as_ours(config["output_model_destination"], modules)


def test_a_fine_tune_writes_a_folder_that_loads_in_diffusers_and_back(tmp_path):
    from diffusers import DPMSolverMultistepScheduler

    FAMILY.fine_tune(tmp_path)
    trained, base = FAMILY.assert_fine_tune_round_trips(tmp_path / "out" / "model")
    assert isinstance(trained.scheduler, DPMSolverMultistepScheduler)  # the model's own sampler, as read
    assert dict(trained.scheduler.config) == dict(base.scheduler.config)


def test_an_embedding_trains_on_gemma_and_prompts_the_pipeline_as_ours(tmp_path):
    """The file holds the vectors under `gemma` (OneTrainer's key); set into diffusers' tokenizer and encoder as new
    tokens (the pipeline has no textual-inversion loader), they give our conditioning."""

    tensors, family, model, method = FAMILY.trained_embedding(tmp_path)
    vectors = tensors["gemma"]
    pipe = pipeline()
    add_embedding_tokens(pipe, vectors)
    with torch.no_grad():
        ours = family.encode_text(model, [method.embeddings.apply("a photo of <shape>")]).hidden_states
        theirs = pipe.encode_prompt(
            ["a photo of <shape> <shape>_1"], False, complex_human_instruction=pipeline_instruction()
        )[0]
    assert torch.allclose(ours, theirs, atol=1e-5)


@pytest.mark.parametrize("kind", ADAPTER_KINDS)
def test_kohya_files_write_onetrainers_names_and_read_back_as_trained(tmp_path, monkeypatch, kind):
    """KOHYA_LORA (OneTrainer's names for Sana: `lora_unet_` + the diffusers module path, `lora_te_` for Gemma-2), in
    each adapter kind: read back into a fresh model it gives the trained transformer's output."""
    state, marker, config, trained = FAMILY.train_lora_file(tmp_path, monkeypatch, kind)
    assert f"lora_unet_transformer_blocks_0_attn1_to_q.{marker}" in state
    assert all(k.startswith("lora_unet_transformer_blocks_") or k.startswith("lora_te_layers_") for k in state)
    assert any(k.startswith("lora_te_layers_0_self_attn_q_proj.") for k in state) is (kind == "lora")
    FAMILY.assert_file_reads_back_as_trained(config, kind, trained)


def test_a_fine_tune_backup_is_a_base_model_and_restores_every_part_whole(tmp_path):
    model, again = FAMILY.assert_backup_round_trips(tmp_path)
    assert again.schedule.sampler_config == model.schedule.sampler_config  # its own sampler kept


def test_a_single_file_base_model_is_refused_with_what_to_give_instead(tmp_path):
    from safetensors.torch import save_file

    from onetrainer.families.loading import ModelLoadError

    path = tmp_path / "sana.safetensors"
    save_file({"x": torch.zeros(1)}, str(path))
    with pytest.raises(ModelLoadError, match="diffusers folder or hub id"):
        our_model(base_model_name=str(path))


def test_lora_tool_extracts_a_fine_tunes_changes_and_merges_them_back(tmp_path):
    """`scripts/lora_tool.py extract` on a Sana folder whose attention and feed-forward 1x1 convolution changed by a
    rank-2 amount gives a KOHYA_LORA of those two layers; merged into the base it gives the changed weights back."""
    import shutil

    from diffusers import SanaTransformer2DModel

    from onetrainer.cli.lora_tool import main as lora_tool

    tuned = tmp_path / "tuned"
    shutil.copytree(tiny_model_dir("sana"), tuned)
    transformer = SanaTransformer2DModel.from_pretrained(str(tuned), subfolder="transformer")
    changed = ["transformer_blocks.0.attn1.to_q", "transformer_blocks.1.ff.conv_inverted"]
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name in changed:
            weight = transformer.get_submodule(name).weight
            rows, columns = weight.flatten(1).shape
            low_rank = torch.randn(rows, 2, generator=generator) @ torch.randn(2, columns, generator=generator)
            weight += 0.05 * low_rank.reshape(weight.shape)
    transformer.save_pretrained(str(tuned / "transformer"))
    lora, merged = tmp_path / "extracted.safetensors", tmp_path / "merged"
    common = ["--model-type", "SANA", "--base-model-name", "tiny:sana", "--output-dtype", "FLOAT_32"]
    assert lora_tool(["extract", *common, "--input-name", str(tuned), "--rank", "2",
                      "--output-model-destination", str(lora)]) == 0  # fmt: skip
    modules = {k.partition(".")[0] for k in load_file(str(lora))}
    assert modules == {"lora_unet_" + name.replace(".", "_") for name in changed}
    assert lora_tool(["merge", *common, "--lora", str(lora), "--output-model-format", "DIFFUSERS",
                      "--output-model-destination", str(merged)]) == 0  # fmt: skip
    again = SanaTransformer2DModel.from_pretrained(str(merged), subfolder="transformer")
    ours, theirs = again.state_dict(), transformer.state_dict()
    assert all(torch.allclose(ours[k], theirs[k], atol=1e-5) for k in theirs)


def test_the_estimate_counts_the_released_model_the_base_names():
    """Sana 1600M by default, the 600M and SANA 1.5 4.8B where the base model's name says so (published sizes)."""
    from onetrainer.config.enums import ModelType
    from onetrainer.training.estimate import reference_shapes

    sizes = {
        "Efficient-Large-Model/Sana_1600M_1024px_BF16_diffusers": 1.6e9,
        "Efficient-Large-Model/Sana_600M_1024px_diffusers": 0.6e9,
        "Efficient-Large-Model/SANA1.5_4.8B_1024px_diffusers": 4.8e9,
    }
    for name, size in sizes.items():
        shapes = reference_shapes(ModelType.SANA, name)
        assert shapes["transformer"]["params"] == pytest.approx(size, rel=0.03), name
        assert shapes["text_encoder"]["params"] == pytest.approx(2.6e9, rel=0.03)  # Gemma-2 2B, its 256k vocabulary


def test_sana_sprint_is_refused_by_name_before_its_weights_are_read(tmp_path):
    import json
    import shutil

    from onetrainer.families.loading import ModelLoadError

    folder = tmp_path / "sprint"
    shutil.copytree(tiny_model_dir("sana"), folder)
    config_file = folder / "transformer" / "config.json"
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()), "guidance_embeds": True}))
    with pytest.raises(ModelLoadError, match="Sana Sprint"):
        our_model(base_model_name=str(folder))


def test_a_dropped_caption_is_zeros_with_no_token_and_predicts_finitely():
    """Caption dropout as OneTrainer's Sana does it: the row's states and mask zeroed; the transformer's cross-attention
    then attends to no token (its mask bias is finite), and the prediction stays finite and differs from the kept
    row's."""
    family, model = our_model()
    with torch.no_grad():
        dropped = family.drop_captions(
            model, CAPTIONS, [torch.tensor([True, False])], lambda c: family.encode_text(model, c)
        )
        assert not dropped.hidden_states[0].any() and not dropped.tensors["attention_mask"][0].any()
        assert dropped.tensors["attention_mask"][1].any()
        noisy = torch.randn(1, 32, 2, 2).expand(2, -1, -1, -1)
        output = family.predict(model, noisy, torch.tensor([500.0, 500.0]), dropped, {}).output
    assert torch.isfinite(output).all() and not torch.allclose(output[0], output[1], atol=1e-4)


def test_layer_offloading_trains_the_same_lora(tmp_path, monkeypatch):
    """Half of the transformer's blocks and of Gemma-2's layers waiting off the device (`layer_blocks`), with
    gradient checkpointing as the presets train: the same losses and the same LoRA as without."""
    assert_offloading_trains_the_same_lora(tmp_path, monkeypatch, "sana", {"SanaTransformer2DModel", "Gemma2Model"})
