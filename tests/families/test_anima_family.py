"""Anima on its tiny model: the conditioning (Qwen3's states through the LLM adapter, T5 ids as its queries), the
latents and the prediction are AnimaModularPipeline's, the text cache keeps each caption's T5 tokens, a LoRA trained
through the trainer samples through the pipeline and its DIFFUSERS_LORA file loads in the pipeline's
`load_lora_weights` (every module of it landing) as ours, its KOHYA_LORA file has OneTrainer's names and reads back, a
fine-tune's folder loads in diffusers and back as a base model, and its original single file loads in diffusers'
`from_single_file` and back."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from PIL import Image
from safetensors import safe_open
from safetensors.torch import load_file

from onetrainer.data.caching import encode_text_entries
from onetrainer.families.anima import TEXT_TOKENS, allow_padding_mask_resize
from onetrainer.families.base import Conditioning
from onetrainer.tiny import tiny_model_dir
from tests.families.tiny_family import (
    ADAPTER_KINDS,
    SAMPLE,
    TinyFamily,
    assert_trained_and_sampled,
    lora_modules,
)
from tests.helpers import (
    assert_offloading_trains_the_same_lora,
)

CAPTIONS = ["a red circle", "Two BLUE squares on a table "]


def pipeline(folder: Path | None = None):
    from diffusers import ModularPipeline

    allow_padding_mask_resize()
    pipe = ModularPipeline.from_pretrained(str(folder or tiny_model_dir("anima")))
    pipe.load_components(dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def transformer_output(transformer: torch.nn.Module) -> torch.Tensor:
    """Two one-frame 4x6 latents, 5 text tokens (the transformer takes no text mask)."""
    allow_padding_mask_resize()
    config = transformer.config
    generator = torch.Generator().manual_seed(0)
    latents = torch.randn(2, config.in_channels, 1, 4, 6, generator=generator)
    text = torch.randn(2, 5, config.text_embed_dim, generator=generator)
    with torch.no_grad():
        return transformer(latents, torch.tensor([0.3, 0.8]), text, padding_mask=torch.zeros(1, 1, 32, 48)).sample


FAMILY = TinyFamily("anima", "ModularPipeline", transformer_output, load_pipeline=pipeline)
our_model = FAMILY.our_model


def pipeline_text(pipe, captions: list[str]) -> torch.Tensor:
    """The pipeline's own prompt encoding: its text-encoder step, then its text-conditioning step."""
    from diffusers.modular_pipelines.anima.before_denoise import AnimaTextConditioningStep
    from diffusers.modular_pipelines.anima.encoders import AnimaTextEncoderStep

    encoded = AnimaTextEncoderStep.encode_prompt(pipe, list(captions), prepare_unconditional_embeds=False)
    return AnimaTextConditioningStep._condition_prompt_embeds(
        pipe,
        encoded["qwen_prompt_embeds"],
        encoded["qwen_attention_mask"],
        encoded["t5_input_ids"],
        encoded["t5_attention_mask"],
        torch.device("cpu"),
        torch.float32,
        torch.float32,
    )


def test_the_conditioning_the_latents_and_the_prediction_are_the_pipelines():
    family, model = our_model()
    pipe = pipeline()
    with torch.no_grad():
        ours = family.encode_text(model, CAPTIONS)
        theirs = pipeline_text(pipe, CAPTIONS)
        assert ours.hidden_states.shape == theirs.shape == (2, TEXT_TOKENS, 32)
        assert torch.allclose(ours.hidden_states, theirs, atol=1e-5)
        t5 = pipe.t5_tokenizer(CAPTIONS, padding="longest", return_tensors="pt").attention_mask
        assert torch.equal(ours.tensors["attention_mask"][:, : t5.shape[1]], t5)
        assert not ours.hidden_states[:, t5.shape[1] :].any()  # zeros after the T5 tokens, as the adapter pads

        pixels = torch.rand(2, 3, 64, 96) * 2 - 1
        latents = family.encode_images(model, pixels)
        vae = pipe.vae
        raw = vae.encode(pixels[:, :, None]).latent_dist.mode()[:, :, 0]
        mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1)
        std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1)
        assert latents.shape == (2, 16, 8, 12)
        assert torch.allclose(latents, (raw - mean) / std, atol=1e-6)  # what the pipeline decodes back

        # σ·1000 from the schedule; the pipeline's loop gives the transformer t / 1000 and a zero padding mask
        noisy, sigma = torch.randn(2, 16, 4, 6), torch.tensor([0.25, 0.75])
        predicted = family.predict(model, noisy, model.schedule.model_time(sigma), ours, {}).output
        expected = pipe.transformer(
            hidden_states=noisy[:, :, None], timestep=sigma, encoder_hidden_states=theirs,
            padding_mask=torch.zeros(1, 1, 32, 48), return_dict=False,
        )[0][:, :, 0]  # fmt: skip
    assert torch.allclose(predicted, expected, atol=1e-5)


def test_the_text_cache_keeps_each_captions_t5_tokens_and_predicts_the_same():
    _, lengths = FAMILY.assert_cached_text_predicts_as_encoded(CAPTIONS, (2, 16, 2, 2))
    assert lengths[0] < lengths[1] < TEXT_TOKENS


def test_samples_prompt_the_pipeline_with_our_encoding():
    family, model = our_model()
    pipe = pipeline()
    with torch.no_grad():
        arguments = family.prompt_arguments(model, "a red circle", "blue")
        from diffusers.modular_pipelines.anima.encoders import AnimaTextEncoderStep

        theirs = AnimaTextEncoderStep.encode_prompt(pipe, ["a red circle"], negative_prompt="blue")
    assert arguments.keys() == theirs.keys()
    for key, value in theirs.items():
        assert value.shape == arguments[key].shape, key
        assert torch.allclose(arguments[key].float(), value.float(), atol=1e-5), key


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    """A DIFFUSERS_LORA on OneTrainer's `attn-mlp` layers (self- and cross-attention, the MLP), its latents and
    captions cached, a sample with a negative prompt."""
    root = tmp_path_factory.mktemp("anima-lora")
    return root, *FAMILY.lora_run(root, {**SAMPLE, "cfg_scale": 3.0})


def test_a_lora_trains_caches_samples_and_every_module_lands_in_the_pipeline_as_ours(lora_run):
    root, config, events = lora_run
    assert_trained_and_sampled(events, root / "cache")
    state = load_file(config["output_model_destination"])
    modules = lora_modules(state)
    assert all(k.startswith("transformer.") for k in state)
    assert {"transformer_blocks.0.attn1.to_q", "transformer_blocks.1.attn2.to_out.0",
            "transformer_blocks.1.ff.net.2"} <= modules  # fmt: skip
    assert not any(m.startswith(("patch_embed", "time_embed", "norm_out", "proj_out")) for m in modules)
    assert not any(".norm1." in m or ".norm2." in m for m in modules)  # the AdaLN branches are not attention
    FAMILY.assert_lora_lands_in_the_pipeline_as_ours(config["output_model_destination"], modules)


@pytest.mark.parametrize("kind", ADAPTER_KINDS)
def test_kohya_files_write_onetrainers_names_and_read_back_as_trained(tmp_path, monkeypatch, kind):
    """KOHYA_LORA: `lora_unet_` + the original DiT's module path (`blocks_0_self_attn_q_proj`), as OneTrainer writes
    it, `lora_te1_` + Qwen3's, in each adapter kind; read back into a fresh model it gives the trained transformer's
    output."""
    state, marker, config, trained = FAMILY.train_lora_file(tmp_path, monkeypatch, kind)
    assert f"lora_unet_blocks_0_self_attn_q_proj.{marker}" in state
    assert f"lora_unet_blocks_1_cross_attn_output_proj.{marker}" in state
    assert all(k.startswith(("lora_unet_blocks_0_", "lora_unet_blocks_1_", "lora_te1_layers_")) for k in state)
    assert not any("mlp" in k for k in state if k.startswith("lora_unet_"))  # attn-only: the DiT's attention
    assert any(k.startswith("lora_te1_layers_0_self_attn_q_proj.") for k in state) is (kind == "lora")
    FAMILY.assert_file_reads_back_as_trained(config, kind, trained)


def test_comfy_files_use_comfyuis_names_which_diffusers_anima_loader_lands(tmp_path, monkeypatch):
    """COMFY_LORA: `diffusion_model.` + the original DiT's module path, dots kept, kohya's suffixes (what ComfyUI's
    LoRA loader maps onto its Anima model): read back as trained. Diffusers' Anima loader converts those names too,
    with peft's suffixes and no alpha: so renamed (trained with alpha = rank, the scale 1 it assumes), every module
    lands in the pipeline and it predicts as ours."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    alpha = {"lora_rank": 4, "lora_alpha": 4.0}
    state, _, config, trained = FAMILY.train_lora_file(
        tmp_path, monkeypatch, "lora", "COMFY_LORA", layer_filter_preset="attn-mlp", **alpha
    )
    assert "diffusion_model.blocks.0.self_attn.q_proj.lora_down.weight" in state
    assert "diffusion_model.blocks.1.mlp.layer2.lora_up.weight" in state
    assert "text_encoders.qwen3_06b.transformer.model.layers.1.mlp.down_proj.alpha" in state
    assert all(
        k.startswith(("diffusion_model.blocks.", "text_encoders.qwen3_06b.transformer.model.layers.")) for k in state
    )
    FAMILY.assert_file_reads_back_as_trained(config, "lora", trained, **alpha)

    pipe = pipeline()
    peft_suffixes = {".lora_down.": ".lora_A.", ".lora_up.": ".lora_B."}
    renamed = {}
    for key, value in state.items():
        for old, new in peft_suffixes.items():
            key = key.replace(old, new)
        if not key.endswith(".alpha"):
            renamed[key] = value
    pipe.load_lora_weights(renamed)
    landed = {name for name, m in pipe.transformer.named_modules() if isinstance(m, BaseTunerLayer)}
    assert "transformer_blocks.0.attn1.to_q" in landed and "transformer_blocks.1.ff.net.2" in landed
    assert len(landed) == len(
        {k.rpartition(".lora_")[0] for k in state if k.startswith("diffusion_model.") and ".lora_" in k}
    )
    assert torch.allclose(transformer_output(pipe.transformer), trained["output"], atol=1e-5)


def test_an_embedding_trains_on_qwen3_and_prompts_the_pipeline_as_ours(tmp_path):
    """The file holds the vectors under the text encoder's key; set into the pipeline's tokenizer and Qwen3 as new
    tokens (it has no textual-inversion loader), its prompt encoding gives our conditioning (the adapter's T5 ids are
    of the same prompt text)."""

    tensors, family, model, method = FAMILY.trained_embedding(tmp_path)
    vectors = tensors["qwen3_06b"]
    pipe = pipeline()
    prompt = method.embeddings.apply("a photo of <shape>")
    tokens = prompt.removeprefix("a photo of ").split(" ")
    assert len(tokens) == len(vectors) > 1
    pipe.tokenizer.add_tokens(tokens)  # the vectors under the names the prompt holds (T5 reads the same text)
    pipe.text_encoder.resize_token_embeddings(len(pipe.tokenizer))
    with torch.no_grad():
        table = pipe.text_encoder.get_input_embeddings().weight
        for token, vector in zip(tokens, vectors, strict=True):
            table[pipe.tokenizer.convert_tokens_to_ids(token)] = vector
        ours = family.encode_text(model, [prompt])
        theirs = pipeline_text(pipe, [prompt])
    assert torch.allclose(ours.hidden_states, theirs, atol=1e-5)


def test_layer_offloading_trains_the_same_lora(tmp_path, monkeypatch):
    """Half of the DiT's blocks and of Qwen3's decoder layers waiting off the device (`layer_blocks`), with gradient
    checkpointing as the presets train: the same losses and the same LoRA as without."""
    assert_offloading_trains_the_same_lora(
        tmp_path, monkeypatch, "anima", {"CosmosTransformer3DModel", "AnimaTextEncoder"}
    )


@pytest.fixture(scope="module")
def fine_tune(tmp_path_factory):
    """A fine-tune of the transformer written as a diffusers folder, and the trained model."""
    root = tmp_path_factory.mktemp("anima-ft")
    FAMILY.fine_tune(root)
    return root / "out" / "model"


def test_a_fine_tune_writes_a_folder_that_loads_in_diffusers_and_back(fine_tune):
    from diffusers import FlowMatchEulerDiscreteScheduler

    trained, base = FAMILY.assert_fine_tune_round_trips(fine_tune, "text_encoder", "text_conditioner", "vae")
    assert isinstance(trained.scheduler, FlowMatchEulerDiscreteScheduler)
    assert trained.scheduler.config.shift == base.scheduler.config.shift


def test_the_original_single_file_is_netted_dit_and_adapter_read_by_diffusers_and_back(tmp_path):
    """ORIGINAL_TRANSFORMER writes the released layout (`net.blocks.N.self_attn.q_proj`, the adapter under
    `net.llm_adapter.`): diffusers' `from_single_file` reads the DiT on the base's config, `transformer.model_name`
    reads back both."""
    from diffusers import CosmosTransformer3DModel

    from onetrainer.config.enums import ModelFormat

    family, model = our_model()
    with torch.no_grad():  # a transformer and an adapter unlike the base's
        for weight in [*model.part("transformer").parameters(), *model.part("text_encoder").conditioner.parameters()]:
            weight.add_(0.01)
    expected = transformer_output(model.part("transformer"))
    expected_text = family.encode_text(model, CAPTIONS).hidden_states.detach()
    path = tmp_path / "anima.safetensors"
    family.save(model, ModelFormat.ORIGINAL_TRANSFORMER, path, torch.float32, None)
    state = load_file(str(path))
    with safe_open(str(path), "pt") as file:  # OneTrainer's name (resources/sd_model_spec/)
        assert file.metadata()["modelspec.architecture"] == "Anima"
    assert all(k.startswith("net.") for k in state)
    assert {"net.x_embedder.proj.1.weight", "net.t_embedder.1.linear_1.weight", "net.t_embedding_norm.weight",
            "net.blocks.1.adaln_modulation_cross_attn.2.weight", "net.blocks.0.self_attn.q_norm.weight",
            "net.blocks.0.mlp.layer1.weight", "net.final_layer.linear.weight", "net.llm_adapter.embed.weight",
            "net.llm_adapter.blocks.1.cross_attn.o_proj.weight"} <= set(state)  # fmt: skip
    adapter = {k.removeprefix("net.llm_adapter."): v for k, v in state.items() if k.startswith("net.llm_adapter.")}
    assert adapter.keys() == model.part("text_encoder").conditioner.state_dict().keys()
    dit = [k for k in state if not k.startswith("net.llm_adapter.")]
    assert len(dit) == len(model.part("transformer").state_dict())

    dit_only = str(tmp_path / "dit.safetensors")  # diffusers' single-file loader reads the DiT (its adapter apart)
    from safetensors.torch import save_file

    save_file({k: state[k] for k in dit}, dit_only)
    theirs = CosmosTransformer3DModel.from_single_file(
        dit_only, config=str(tiny_model_dir("anima")), subfolder="transformer", local_files_only=True
    )
    assert torch.allclose(transformer_output(theirs), expected, atol=1e-6)
    _, again = our_model(transformer={"model_name": str(path)})
    assert torch.equal(transformer_output(again.part("transformer")), expected)
    assert torch.equal(family.encode_text(again, CAPTIONS).hidden_states, expected_text)


def test_the_sampling_tool_renders_the_model_and_its_lora(lora_run, in_tmp):
    """scripts/sample.py on the tiny model: a picture of the asked size through the pipeline, which the LoRA trained
    above changes."""
    import numpy as np

    from onetrainer.cli.sample import EXIT_OK, main

    _, config, _ = lora_run
    base = str(tiny_model_dir("anima"))
    args = ["--model-type", "ANIMA", "--base-model", base, "--width", "64", "--height", "48", "--steps", "2",
            "--cfg-scale", "3", "--device", "cpu", "--prompt", "a red circle", "--seed", "3"]  # fmt: skip
    assert main([*args, "--output", "plain.png"]) == EXIT_OK
    assert main([*args, "--lora", config["output_model_destination"], "--output", "lora.png"]) == EXIT_OK
    plain, lora = (np.asarray(Image.open(in_tmp / n).convert("RGB"), dtype=np.int16) for n in ("plain.png", "lora.png"))
    assert plain.shape == (48, 64, 3) and plain.std() > 0
    assert np.abs(plain - lora).max() > 0


def test_a_backup_gives_each_part_back_the_text_encoder_from_its_two_folders(tmp_path):
    """A fine-tune backup is the pipeline folder; the text-encoder part (Qwen3 and the adapter) is read back from
    `text_encoder/` and `text_conditioner/` under the part's own names."""
    family, model = our_model()
    family.save_backup(model, tmp_path / "model")
    for part in ("transformer", "text_encoder"):
        state, own = family.backup_state(model, tmp_path / "model", part), model.part(part).state_dict()
        assert state.keys() == own.keys(), part
        assert all(torch.equal(state[k], own[k]) for k in own), part


def test_a_dropped_caption_is_the_empty_caption_the_pipelines_negative_prompt():
    """Caption dropout encodes "" (no Qwen3 token at all, the T5 end token alone), finite and as the pipeline encodes
    its default negative prompt; from the text cache it predicts as encoded whole."""
    family, model = our_model()
    pipe = pipeline()
    cache = dict(zip(["", *CAPTIONS], encode_text_entries(family, model, ["", *CAPTIONS]), strict=True))
    with torch.no_grad():
        empty = family.encode_text(model, [""]).hidden_states
        assert torch.isfinite(empty).all() and empty[:, 1:].abs().sum() == 0  # the adapter's output at one T5 token
        assert torch.allclose(empty, pipeline_text(pipe, [""]), atol=1e-5)
        dropped = family.drop_captions(
            model, CAPTIONS, [torch.tensor([True, False])], lambda c: Conditioning.stack([cache[x] for x in c], "cpu")
        )
        noisy, times = torch.randn(2, 16, 2, 2), torch.tensor([300.0, 700.0])
        from_cache = family.predict(model, noisy, times, dropped, {}).output
        whole = family.predict(model, noisy, times, family.encode_text(model, ["", CAPTIONS[1]]), {}).output
    assert torch.allclose(from_cache, whole, atol=1e-6)


def test_the_tiny_qwen3_ends_texts_with_its_start_token_as_the_released_base_model():
    """Anima's Qwen3-0.6B is the base model: "<|endoftext|>" starts and ends a text (the chat model ends with
    "<|im_end|>"); the tiny model's config names that token's id in its own vocabulary for both."""
    import json

    from transformers import AutoTokenizer

    folder = tiny_model_dir("anima")
    config = json.loads((folder / "text_encoder" / "config.json").read_text(encoding="utf-8"))
    tokenizer = AutoTokenizer.from_pretrained(str(folder / "tokenizer"))
    end_of_text = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    assert end_of_text != tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert config["bos_token_id"] == config["eos_token_id"] == end_of_text
    assert config["max_position_embeddings"] == 32768
