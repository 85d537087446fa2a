"""Krea 2 on its tiny model: the conditioning (Qwen3-VL's stacked layers through the pipeline's template), the latents
and the prediction are Krea2Pipeline's, the text cache keeps each caption's attended tokens, a LoRA trained through
the trainer samples and its DIFFUSERS_LORA file loads in diffusers' `load_lora_weights` (every module of it landing)
as ours, a fine-tune's folder loads in diffusers and back as a base model."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from onetrainer.data.caching import encode_text_entries
from onetrainer.families.base import Conditioning
from onetrainer.families.krea2 import TEXT_TOKENS, Krea2State
from onetrainer.tiny import tiny_model_dir
from tests.families.tiny_family import (
    ADAPTER_KINDS,
    SAMPLE,
    TinyFamily,
    assert_trained_and_sampled,
    lora_modules,
)
from tests.helpers import (
    add_embedding_tokens,
    assert_offloading_trains_the_same_lora,
)

CAPTIONS = ["a red circle", "Two BLUE squares on a table "]


def transformer_output(transformer: torch.nn.Module) -> torch.Tensor:
    """Two rows of 4x6 latent tokens after 7 text tokens (the second's middle 3 padding)."""
    from diffusers import Krea2Pipeline

    config = transformer.config
    generator = torch.Generator().manual_seed(0)
    latents = torch.randn(2, 6, config.in_channels, generator=generator)
    text = torch.randn(2, 7, config.num_text_layers, config.text_hidden_dim, generator=generator)
    mask = torch.tensor([[True] * 7, [True] * 2 + [False] * 3 + [True] * 2])
    positions = Krea2Pipeline.prepare_position_ids(7, 2, 3, "cpu")
    with torch.no_grad():
        return transformer(latents, text, torch.tensor([0.3, 0.8]), positions, encoder_attention_mask=mask).sample


FAMILY = TinyFamily("krea2", "Krea2Pipeline", transformer_output)
our_model, pipeline = FAMILY.our_model, FAMILY.pipeline


def pipeline_prediction(pipe, noisy: torch.Tensor, sigma: torch.Tensor, embeds, mask) -> torch.Tensor:
    """The transformer's flow as the pipeline calls it (its packing, positions and time), unpacked to [B, C, h, w]."""
    batch, channels, height, width = noisy.shape
    positions = pipe.prepare_position_ids(embeds.shape[1], height // 2, width // 2, "cpu")
    packed = pipe._pack_latents(noisy, batch, channels, height, width)
    output = pipe.transformer(
        hidden_states=packed, encoder_hidden_states=embeds, timestep=sigma, position_ids=positions,
        encoder_attention_mask=mask,
    ).sample  # fmt: skip
    return pipe._unpack_latents(output, height * pipe.vae_scale_factor, width * pipe.vae_scale_factor)[:, :, 0]


def test_the_conditioning_the_latents_and_the_prediction_are_the_pipelines():
    family, model = our_model()
    pipe = pipeline()
    assert model.family_state(Krea2State).select_layers == pipe.text_encoder_select_layers == (1, 2)
    with torch.no_grad():
        ours = family.encode_text(model, CAPTIONS)
        embeds, mask = pipe.encode_prompt(list(CAPTIONS))
        assert ours.hidden_states.shape == (2, TEXT_TOKENS, 2, 32)  # 512 tokens, 2 tapped layers of 32
        assert torch.equal(ours.hidden_states, embeds) and torch.equal(ours.tensors["attention_mask"], mask)
        # the padding sits between each caption and the 5 closing tokens
        assert mask[:, -5:].all() and not mask[:, -6].any()

        pixels = torch.rand(2, 3, 64, 96) * 2 - 1
        latents = family.encode_images(model, pixels)
        vae = pipe.vae
        raw = vae.encode(pixels[:, :, None]).latent_dist.mode()[:, :, 0]
        mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1)
        std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1)
        assert latents.shape == (2, 16, 8, 12)
        assert torch.allclose(latents, (raw - mean) / std, atol=1e-6)  # what the pipeline decodes back

        # σ·1000 from the schedule, σ into the transformer; our rows hand it only their attended tokens
        noisy, sigma = torch.randn(2, 16, 4, 6), torch.tensor([0.25, 0.75])
        predicted = family.predict(model, noisy, model.schedule.model_time(sigma), ours, {}).output
        theirs = pipeline_prediction(pipe, noisy, sigma, embeds, mask)
    assert torch.allclose(predicted, theirs, atol=1e-5)


def test_the_text_cache_keeps_each_captions_attended_tokens_and_predicts_the_same():
    rows, lengths = FAMILY.assert_cached_text_predicts_as_encoded(CAPTIONS, (2, 16, 2, 2))
    assert lengths[0] < lengths[1] < TEXT_TOKENS
    assert all(r["attention_mask"].all() for r in rows)


def test_samples_pass_our_embeddings_and_the_cfg_scale_as_krea_guidance():
    from onetrainer.config.sample_config import SampleConfig

    family, model = our_model()
    sample = SampleConfig(prompt="a red circle", cfg_scale=4.0)
    assert family.pipeline_arguments(model, sample, False) == {"guidance_scale": 3.0}  # cond + 3·(cond − uncond)
    assert family.pipeline_arguments(model, SampleConfig(cfg_scale=1.0), False) == {"guidance_scale": 0.0}
    pipe = pipeline()
    with torch.no_grad():
        arguments = family.prompt_arguments(model, "a red circle", None)
        embeds, mask = pipe.encode_prompt(["a red circle"])
    # the negative prompt ("") is shorter: padded to the prompt's count, masked, as the pipeline gives both one length
    prompt, negative = arguments["prompt_embeds_mask"], arguments["negative_prompt_embeds_mask"]
    assert prompt.dtype == torch.bool and prompt.all() and prompt.shape == negative.shape
    assert 0 < int(negative.sum()) < negative.shape[1]
    assert torch.equal(arguments["prompt_embeds"], embeds[:, mask[0]])


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    """A DIFFUSERS_LORA on OneTrainer's `attn-mlp` layers (attention and feed-forward, the text fusion's too), its
    latents and captions cached, a sample with a negative prompt."""
    root = tmp_path_factory.mktemp("krea2-lora")
    return root, *FAMILY.lora_run(root, {**SAMPLE, "cfg_scale": 3.0})


def test_a_lora_trains_caches_samples_and_every_module_lands_in_diffusers_as_ours(lora_run):
    root, config, events = lora_run
    assert_trained_and_sampled(events, root / "cache")
    state = load_file(config["output_model_destination"])
    modules = lora_modules(state)
    assert all(k.startswith("transformer.") for k in state)
    assert {"transformer_blocks.0.attn.to_q", "transformer_blocks.1.attn.to_gate", "transformer_blocks.1.ff.down",
            "text_fusion.refiner_blocks.0.attn.to_k", "text_fusion.layerwise_blocks.1.ff.up"} <= modules  # fmt: skip
    assert not any(m.startswith(("img_in", "txt_in", "time_embed", "final_layer")) for m in modules)
    FAMILY.assert_lora_lands_in_the_pipeline_as_ours(config["output_model_destination"], modules)


def test_a_fine_tune_writes_a_folder_that_loads_in_diffusers_and_back(tmp_path):
    from diffusers import FlowMatchEulerDiscreteScheduler

    FAMILY.fine_tune(tmp_path)
    trained, base = FAMILY.assert_fine_tune_round_trips(tmp_path / "out" / "model")
    assert isinstance(trained.scheduler, FlowMatchEulerDiscreteScheduler)
    assert trained.text_encoder_select_layers == base.text_encoder_select_layers  # the taps travel in model_index
    assert trained.config.is_distilled is False


def test_a_distilled_model_samples_in_8_steps_without_guidance(tmp_path):
    import json
    import shutil

    folder = tmp_path / "turbo"
    shutil.copytree(tiny_model_dir("krea2"), folder)
    index_file = folder / "model_index.json"
    index_file.write_text(json.dumps({**json.loads(index_file.read_text()), "is_distilled": True}))
    family, model = our_model(base_model_name=str(folder))
    defaults = family.sample_defaults(model)
    assert (defaults.diffusion_steps, defaults.cfg_scale) == (8, 1.0)
    assert family.pipeline(model, None).config.is_distilled is True  # the pipeline's fixed shift
    _, raw = our_model()
    assert family.sample_defaults(raw).diffusion_steps == 28


def test_taps_that_do_not_fit_the_transformer_are_refused_by_name(tmp_path):
    import json
    import shutil

    from onetrainer.families.loading import ModelLoadError

    folder = tmp_path / "odd"
    shutil.copytree(tiny_model_dir("krea2"), folder)
    index_file = folder / "model_index.json"
    index_file.write_text(json.dumps({**json.loads(index_file.read_text()), "text_encoder_select_layers": [1]}))
    with pytest.raises(ModelLoadError, match="text_encoder_select_layers"):
        our_model(base_model_name=str(folder))


def test_a_single_file_base_model_is_refused_with_what_to_give_instead(tmp_path):
    from safetensors.torch import save_file

    from onetrainer.families.loading import ModelLoadError

    path = tmp_path / "krea2.safetensors"
    save_file({"x": torch.zeros(1)}, str(path))
    with pytest.raises(ModelLoadError, match=r"diffusers Krea 2 folder or hub id .*transformer\.model_name"):
        our_model(base_model_name=str(path))


def test_the_original_transformer_is_kreas_layout_read_by_diffusers_and_back_as_the_transformers_model(tmp_path):
    """ORIGINAL_TRANSFORMER writes Krea's names (raw.safetensors: `blocks.N.attn.wq`, flattened modulation tables),
    which diffusers' `from_single_file` reads on the base's config, and `transformer.model_name` reads back."""
    from diffusers import Krea2Transformer2DModel

    from onetrainer.config.enums import ModelFormat

    family, model = FAMILY.changed_model()
    expected = transformer_output(model.part("transformer"))
    path = tmp_path / "raw.safetensors"
    family.save(model, ModelFormat.ORIGINAL_TRANSFORMER, path, torch.float32, None)
    state = load_file(str(path))
    width = model.part("transformer").config.num_attention_heads * model.part("transformer").config.attention_head_dim
    assert state["blocks.1.mod.lin"].shape == (6 * width,) and "txtfusion.projector.weight" in state
    assert "blocks.0.attn.qknorm.qnorm.scale" in state and not any(k.startswith("transformer_blocks") for k in state)
    theirs = Krea2Transformer2DModel.from_single_file(
        str(path), config=str(tiny_model_dir("krea2")), subfolder="transformer", local_files_only=True
    )
    assert torch.allclose(transformer_output(theirs), expected, atol=1e-6)
    _, again = our_model(transformer={"model_name": str(path)})
    assert torch.equal(transformer_output(again.part("transformer")), expected)


def test_the_estimate_counts_the_released_model():
    """Krea 2's 12.8B transformer (diffusers' default config) and Qwen3-VL-4B (4.4B with its vision tower)."""
    from onetrainer.config.enums import ModelType
    from onetrainer.training.estimate import reference_shapes

    shapes = reference_shapes(ModelType.KREA_2, "krea/Krea-2-Raw")
    assert shapes["transformer"]["params"] == pytest.approx(12.8e9, rel=0.02)
    assert shapes["text_encoder"]["params"] == pytest.approx(4.44e9, rel=0.02)


@pytest.mark.parametrize("kind", ADAPTER_KINDS)
def test_kohya_files_write_lora_unet_names_and_read_back_as_trained(tmp_path, monkeypatch, kind):
    """KOHYA_LORA (`lora_unet_` + the diffusers module path, `lora_te1_` for Qwen3-VL's language model), in each
    adapter kind: read back into a fresh model it gives the trained transformer's output."""
    state, marker, config, trained = FAMILY.train_lora_file(tmp_path, monkeypatch, kind)
    assert f"lora_unet_transformer_blocks_0_attn_to_q.{marker}" in state
    assert f"lora_unet_text_fusion_refiner_blocks_0_attn_to_gate.{marker}" in state
    assert all(k.startswith(("lora_unet_transformer_blocks_", "lora_unet_text_fusion_", "lora_te1_")) for k in state)
    te = any(k.startswith("lora_te1_language_model_layers_0_self_attn_q_proj.") for k in state)
    assert te is (kind == "lora")
    FAMILY.assert_file_reads_back_as_trained(config, kind, trained)


def test_an_embedding_trains_on_qwen3_vl_and_prompts_the_pipeline_as_ours(tmp_path):
    """The file holds the vectors under the text encoder's key; set into diffusers' tokenizer and encoder as new tokens
    (the pipeline has no textual-inversion loader), they give our conditioning."""

    tensors, family, model, method = FAMILY.trained_embedding(tmp_path)
    vectors = tensors["qwen3vl_4b"]
    pipe = pipeline()
    add_embedding_tokens(pipe, vectors)
    with torch.no_grad():
        ours = family.encode_text(model, [method.embeddings.apply("a photo of <shape>")])
        theirs, mask = pipe.encode_prompt(["a photo of <shape> <shape>_1"])
    assert torch.equal(ours.tensors["attention_mask"], mask)
    assert torch.allclose(ours.hidden_states, theirs, atol=1e-5)


def test_layer_offloading_trains_the_same_lora(tmp_path, monkeypatch):
    """Half of the transformer's blocks and of Qwen3-VL's decoder layers waiting off the device (`layer_blocks`), with
    gradient checkpointing as the presets train: the same losses and the same LoRA as without."""
    assert_offloading_trains_the_same_lora(tmp_path, monkeypatch, "krea2", {"Krea2Transformer2DModel", "Qwen3VLModel"})


def test_a_dropped_caption_is_the_empty_captions_tokens_from_the_text_cache():
    """Caption dropout encodes the empty caption (the pipeline's negative prompt); from the text cache, the batch's
    rows of different lengths stack padded and predict as the captions encoded whole."""
    from onetrainer.families.krea2 import attended_tokens

    family, model = our_model()
    cache = {c: row for c, row in zip(["", *CAPTIONS], encode_text_entries(family, model, ["", *CAPTIONS]))}
    with torch.no_grad():
        dropped = family.drop_captions(
            model, CAPTIONS, [torch.tensor([True, False])], lambda c: Conditioning.stack([cache[x] for x in c], "cpu")
        )
        hidden, mask = attended_tokens(dropped)
        empty, _ = attended_tokens(family.encode_text(model, [""]))
        assert torch.equal(hidden[0, : empty.shape[1]], empty[0]) and int(mask[0].sum()) == empty.shape[1] == 5
        whole = family.encode_text(model, ["", CAPTIONS[1]])
        noisy, times = torch.randn(2, 16, 2, 2), torch.tensor([300.0, 700.0])
        from_cache = family.predict(model, noisy, times, dropped, {}).output
        full = family.predict(model, noisy, times, whole, {}).output
    assert torch.allclose(from_cache, full, atol=1e-6)
