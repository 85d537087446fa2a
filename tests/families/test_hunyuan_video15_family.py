"""HunyuanVideo 1.5 on its tiny model: the conditioning (Qwen2.5-VL in the pipeline's chat template, its third-last
states cut after the template's 108 tokens; the glyph encoder on quoted text), the latents and the prediction are
HunyuanVideo15Pipeline's; the text cache keeps each caption's tokens of both encoders; a folder of clips and a still
trains a LoRA from the CLI (`scripts/train.py`'s main), its clips' latents cached 5-D, and the DIFFUSERS_LORA file
lands on every trained module of the pipeline's transformer (the pipeline has no LoRA loader: its transformer's
`load_lora_adapter`) with our output; samples are clips of the sample's frames, as the pipeline renders them; a
fine-tune writes a folder that loads in diffusers and back. The clips are written here with PyAV."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

from onetrainer.data.caching import encode_text_entries
from onetrainer.families.base import Conditioning
from onetrainer.families.hunyuan_video15 import GLYPH_TOKENS, TEXT_TOKENS
from onetrainer.sampling.clip import SampleClip
from tests.families.tiny_family import KIND_SETTINGS
from tests.families.tiny_video_family import CLIP_CAPTIONS, CLIP_SAMPLE, TinyVideoFamily, assert_clip_has
from tests.helpers import run_config

VARIANT = "hunyuan-video15"
# one caption with quoted text (the glyph encoder reads it), one without, one empty (the negative prompt's default)
CAPTIONS = ['a sign that says "OPEN" in a shop', "Two BLUE squares on a table", ""]


def transformer_output(transformer: torch.nn.Module) -> torch.Tensor:
    """Two clips of 2 latent frames of 3x4 (with text to video's zero conditioning channels), 7 Qwen tokens (the
    second's last 2 masked), 5 glyph tokens (none for the second), the zero image embedding."""
    config = transformer.config
    generator = torch.Generator().manual_seed(0)
    latents = torch.randn(2, config.out_channels, 2, 3, 4, generator=generator)
    hidden = torch.cat([latents, torch.zeros(2, config.in_channels - config.out_channels, 2, 3, 4)], dim=1)
    mask = torch.ones(2, 7)
    mask[1, 5:] = 0
    glyph_mask = torch.ones(2, 5)
    glyph_mask[1] = 0
    with torch.no_grad():
        return transformer(
            hidden_states=hidden,
            timestep=torch.tensor([300.0, 800.0]),
            encoder_hidden_states=torch.randn(2, 7, config.text_embed_dim, generator=generator),
            encoder_attention_mask=mask,
            encoder_hidden_states_2=torch.randn(2, 5, config.text_embed_2_dim, generator=generator),
            encoder_attention_mask_2=glyph_mask,
            image_embeds=torch.zeros(2, 3, config.image_embed_dim),
            return_dict=False,
        )[0]


FAMILY = TinyVideoFamily(
    VARIANT, "HunyuanVideo15Pipeline", transformer_output, frozen_text=("text_encoder", "text_encoder_2"),
    clip_captions=(CLIP_CAPTIONS[0], 'a cat spins under a sign "SPIN"', CLIP_CAPTIONS[2]),  # one quoting text
)  # fmt: skip
our_model, pipeline = FAMILY.our_model, FAMILY.pipeline


def test_the_conditioning_the_latents_and_the_prediction_are_the_pipelines():
    family, model = our_model()
    pipe = pipeline()
    with torch.no_grad():
        ours = family.encode_text(model, CAPTIONS)
        embeds, mask, glyphs, glyph_mask = pipe.encode_prompt(list(CAPTIONS), batch_size=len(CAPTIONS))
        assert ours.hidden_states.shape == (3, TEXT_TOKENS, 32)
        assert ours.tensors["glyph_states"].shape == (3, GLYPH_TOKENS, 32)
        tokens = ours.tensors["attention_mask"]
        assert torch.equal(tokens, mask.long()) and 0 < int(tokens[1].sum()) < TEXT_TOKENS
        assert torch.allclose(ours.hidden_states * tokens[..., None], embeds * mask[..., None], atol=1e-6)
        assert torch.equal(ours.tensors["glyph_mask"], glyph_mask.long())
        assert int(glyph_mask[0].sum()) == len('Text "OPEN". ') + 1 and not glyph_mask[1:].any()  # bytes + </s>
        assert torch.allclose(ours.tensors["glyph_states"], glyphs, atol=1e-6)

        assert model.part("vae").use_tiling  # spatial tiles above 256 px; these clips are smaller
        clips = torch.rand(2, 3, 5, 48, 64) * 2 - 1
        latents = family.encode_images(model, clips)
        raw = torch.cat([pipe.vae.encode(clip[None]).latent_dist.mode() for clip in clips])  # batches of one only
        assert latents.shape == (2, 32, 2, 3, 4)  # 5 frames → 1 + 1 latent frames, 16x spatial
        assert torch.allclose(latents, raw * pipe.vae.config.scaling_factor, atol=1e-6)  # what the pipeline decodes
        assert family.encode_images(model, clips[:, :, 0]).shape == (2, 32, 1, 3, 4)  # a still: a one-frame clip

        sigma = torch.tensor([0.25, 0.75, 0.5])
        noisy = torch.randn(3, 32, 2, 3, 4)
        predicted = family.predict(model, noisy, model.schedule.model_time(sigma), ours, {}).output
        config = pipe.transformer.config
        theirs = pipe.transformer(  # as the pipeline's denoising loop calls it for text to video
            hidden_states=torch.cat([noisy, torch.zeros(3, config.in_channels - 32, 2, 3, 4)], dim=1),
            image_embeds=torch.zeros(3, pipe.vision_num_semantic_tokens, config.image_embed_dim),
            timestep=sigma * 1000,
            encoder_hidden_states=embeds,
            encoder_attention_mask=mask,
            encoder_hidden_states_2=glyphs,
            encoder_attention_mask_2=glyph_mask,
            return_dict=False,
        )[0]
    assert predicted.shape == noisy.shape and torch.allclose(predicted, theirs, atol=1e-5)


def test_the_text_cache_keeps_each_captions_tokens_and_predicts_the_same():
    family, model = our_model()
    rows = encode_text_entries(family, model, CAPTIONS)
    with torch.no_grad():
        encoded = family.encode_text(model, CAPTIONS)
        lengths = [int(m.sum()) for m in encoded.tensors["attention_mask"]]
        assert [len(r["hidden_states"]) for r in rows] == lengths and len(set(lengths)) == 3
        assert [len(r["glyph_states"]) for r in rows] == [int(encoded.tensors["glyph_mask"][0].sum()), 1, 1]
        cached = Conditioning.stack(rows, "cpu")
        noisy, times = torch.randn(3, 32, 1, 2, 2), torch.tensor([100.0, 900.0, 500.0])
        from_cache = family.predict(model, noisy, times, cached, {}).output
        full = family.predict(model, noisy, times, encoded, {}).output
    assert torch.allclose(from_cache, full, atol=1e-6)


def test_samples_are_clips_of_the_samples_frames_as_the_pipeline_renders_them():
    from diffusers import FlowMatchEulerDiscreteScheduler

    from onetrainer.config.sample_config import SampleConfig
    from onetrainer.sampling.sampler import render

    family, model = our_model()
    assert isinstance(family.own_sampler(model), FlowMatchEulerDiscreteScheduler)
    assert family.own_sampler(model).config.shift == 5.0
    sample = SampleConfig(prompt='a sign "OPEN"', negative_prompt="blur", width=64, height=48, frames=6, seed=3,
                          diffusion_steps=2, cfg_scale=4.0)  # fmt: skip
    ours = render(family, model, sample)
    assert isinstance(ours, SampleClip) and len(ours.frames) == 5 and ours.fps == 24.0  # 4k + 1, rounded down
    assert all(frame.size == (64, 48) for frame in ours.frames)

    from diffusers import ClassifierFreeGuidance

    pipe = pipeline()
    pipe.guider = ClassifierFreeGuidance(guidance_scale=4.0)
    output = pipe(prompt='a sign "OPEN"', negative_prompt="blur", height=48, width=64, num_frames=5,
                  num_inference_steps=2, generator=torch.Generator().manual_seed(3), output_type="np")  # fmt: skip
    theirs = (np.clip(output.frames[0], 0, 1) * 255).round().astype(np.uint8)
    assert max(int(np.abs(np.asarray(f).astype(int) - t.astype(int)).max()) for f, t in zip(ours.frames, theirs)) <= 1


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    """A DIFFUSERS_LORA on the dual-stream blocks' attention and feed-forwards (`attn-mlp`), from `scripts/train.py`'s
    main with a config file: a folder of two clips (5-frame windows) and a still, latents and captions cached, a
    sample clip."""
    root = tmp_path_factory.mktemp("hunyuan-video15-lora")
    return root, FAMILY.cli_lora_run(root, {**CLIP_SAMPLE, "negative_prompt": "blur", "cfg_scale": 3.0})


def test_clips_and_a_still_train_from_the_cli_with_5d_latents_cached(lora_run):
    FAMILY.assert_clips_cached_and_sampled(*lora_run, channels=32)


def test_every_module_of_the_diffusers_lora_lands_in_the_pipelines_transformer_as_ours(lora_run):
    """HunyuanVideo15Pipeline has no LoRA loader (no `load_lora_weights`): its transformer's `load_lora_adapter`
    reads the file's `transformer.` part."""
    from diffusers import HunyuanVideo15Pipeline

    assert not hasattr(HunyuanVideo15Pipeline, "load_lora_weights")
    path, state, modules = FAMILY.diffusers_lora(lora_run[1])
    assert all(k.startswith("transformer.transformer_blocks.") for k in state)
    per_block = ["attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0", "attn.add_q_proj", "attn.add_k_proj",
                 "attn.add_v_proj", "attn.to_add_out", "ff.net.0.proj", "ff.net.2", "ff_context.net.0.proj",
                 "ff_context.net.2"]  # fmt: skip
    assert modules == {f"transformer_blocks.{i}.{name}" for i in range(2) for name in per_block}
    FAMILY.assert_lora_lands_in_the_pipeline_as_ours(
        path, modules, load=lambda pipe, file: pipe.transformer.load_lora_adapter(file, prefix="transformer")
    )


def test_a_fine_tune_writes_a_folder_that_loads_in_diffusers_and_back(tmp_path):
    from diffusers import ClassifierFreeGuidance, FlowMatchEulerDiscreteScheduler

    FAMILY.fine_tune_clips(tmp_path)
    trained, _ = FAMILY.assert_fine_tune_round_trips(tmp_path / "out" / "model")  # in diffusers and as a base model
    assert isinstance(trained.scheduler, FlowMatchEulerDiscreteScheduler) and trained.scheduler.config.shift == 5.0
    assert isinstance(trained.guider, ClassifierFreeGuidance) and trained.guider.guidance_scale == 6.0
    index = json.loads((tmp_path / "out" / "model" / "model_index.json").read_text())
    assert index["_class_name"] == "HunyuanVideo15Pipeline"


@pytest.mark.parametrize("kind", ["loha", "lokr"])
def test_lycoris_kinds_train_on_clips_and_read_back_as_trained(tmp_path, monkeypatch, kind):
    """LoHa and LoKr (LyCORIS kinds) as KOHYA_LORA (`lora_unet_` + the diffusers module path); read back into a fresh
    model they give the trained transformer. The same adapters as COMFY_LORA: q, k and v kept apart (their ΔW has no
    exact form on the fused projection) under `diffusion_model.` + the diffusers path, the output projection under
    ComfyUI's name; read back, the same transformer."""
    state, marker, config, trained, _ = FAMILY.train_clip_adapter(
        tmp_path, monkeypatch, kind, "KOHYA_LORA", layer_filter_preset="attn-only"
    )
    assert f"lora_unet_transformer_blocks_0_attn_add_q_proj.{marker}" in state
    assert all(k.startswith("lora_unet_transformer_blocks_") and "_attn_" in k for k in state)  # not the refiner's
    FAMILY.assert_file_reads_back_as_trained(config, kind, trained, atol=1e-5)

    comfy = tmp_path / "comfy.safetensors"
    state = FAMILY.save_lora_as(config, comfy, "COMFY_LORA")
    assert f"diffusion_model.transformer_blocks.0.attn.to_q.{marker}" in state
    assert f"diffusion_model.double_blocks.0.img_attn.proj.{marker}" in state
    settings = KIND_SETTINGS[kind]
    _, back = our_model(method=True, lora_model_name=str(comfy), output_model_format="COMFY_LORA", **settings)
    assert torch.allclose(transformer_output(back.part("transformer")), trained["output"], atol=1e-5)


def test_an_embedding_trains_on_qwen_and_prompts_the_pipeline_as_ours(tmp_path):
    """The file holds the vectors under `qwen` (and `byt5`); set into the pipeline's Qwen tokenizer and decoder as new
    tokens (the pipeline has no textual-inversion loader), they give our conditioning: the template's cut at 108 tokens
    lies before the caption (stills train as one-frame clips)."""
    vectors, family, model, method = FAMILY.trained_embedding(tmp_path)  # the run continues from the file
    assert {"qwen", "byt5"} <= vectors.keys()
    pipe = pipeline()
    tokens = ["<shape>"] + [f"<shape>_{i}" for i in range(1, len(vectors["qwen"]))]
    pipe.tokenizer.add_tokens(tokens)
    embedding = pipe.text_encoder.resize_token_embeddings(len(pipe.tokenizer))
    with torch.no_grad():
        embedding.weight[-len(tokens) :] = vectors["qwen"]
        ours = family.encode_text(model, [method.embeddings.apply("a photo of <shape>")])
        theirs, mask, _, _ = pipe.encode_prompt([f"a photo of {' '.join(tokens)}"])
    assert torch.equal(ours.tensors["attention_mask"], mask.long())
    assert torch.allclose(ours.hidden_states, theirs * mask[..., None], atol=1e-5)


def test_layer_offloading_with_checkpointing_trains_the_same_lora(tmp_path, monkeypatch):
    """Half of the transformer's dual-stream blocks and Qwen2.5-VL's layers waiting off the device, gradient
    checkpointing on (as the 16 GB preset trains): the same losses and LoRA as without (stills as one-frame clips)."""
    from tests.helpers import assert_offloading_trains_the_same_lora

    assert_offloading_trains_the_same_lora(
        tmp_path, monkeypatch, VARIANT, {"HunyuanVideo15Transformer3DModel", "Qwen2_5_VLTextModel"}
    )


def test_clips_train_with_8_bit_weights_and_a_clip_mask(tmp_path):
    """A LoRA over a float8 transformer and an int8 Qwen2.5-VL, on clips, one of them with a mask (one `-masklabel.png`
    for the whole clip): it trains (finite losses) and writes its file."""
    from onetrainer.training.events import Metrics

    config = FAMILY.clip_config(
        tmp_path, "LORA", epochs=1, learning_rate=1e-2, output_model_format="DIFFUSERS_LORA",
        layer_filter_preset="attn-only", masked_training=True, unmasked_probability=0.0,
        transformer={"weight_dtype": "FLOAT_8"}, text_encoder={"train": False, "weight_dtype": "INT_8"},
    )  # fmt: skip
    mask = Image.new("L", (64, 48), 0)
    mask.paste(255, (0, 0, 32, 48))
    mask.save(Path(config["concepts"][0]["path"]) / "walk-masklabel.png")
    losses = [e.loss for e in run_config(config) if isinstance(e, Metrics)]
    assert losses and all(torch.isfinite(torch.tensor(losses)))
    assert any(
        k.startswith("transformer.transformer_blocks.0.attn.") for k in load_file(config["output_model_destination"])
    )


def test_scripts_sample_writes_a_clip(tmp_path):
    """`scripts/sample.py` renders through the same `render`: the sample is written as a clip of the frames asked, a
    GIF here by the output's suffix."""
    from onetrainer.cli.sample import EXIT_OK, main

    output = tmp_path / "sign.gif"
    argv = ["--model-type", "HUNYUAN_VIDEO_15", "--base-model", f"tiny:{VARIANT}", "--prompt", 'a sign "OPEN"',
            "--width", "64", "--height", "48", "--steps", "2", "--frames", "5", "--output", str(output)]  # fmt: skip
    assert main(argv) == EXIT_OK
    assert_clip_has(output)


def test_the_comfyui_layout_fuses_each_streams_qkv_and_reads_back_as_trained(lora_run, tmp_path):
    """The trained adapters written as COMFY_LORA over ComfyUI's module names (`diffusion_model.double_blocks.N.
    img_attn.qkv`, `txt_attn.proj`, `img_mlp.0`, …): each stream's q, k, v one LoRA on its fused projection whose ΔW
    is the three projections' ΔW stacked (checked from the file's tensors), and ours reads the file back as trained."""
    _, config = lora_run
    path = tmp_path / "comfy.safetensors"
    state = FAMILY.save_lora_as(config, path, "COMFY_LORA")
    prefix = "diffusion_model.double_blocks.1."
    names = ("img_attn.qkv", "txt_attn.qkv", "img_attn.proj", "txt_attn.proj", "img_mlp.0", "txt_mlp.2")
    assert {f"{prefix}{name}.lora_down.weight" for name in names} <= state.keys()
    assert all(k.startswith("diffusion_model.double_blocks.") for k in state)

    diffusers = load_file(config["output_model_destination"])  # alpha folded into lora_B

    def delta(module: str) -> torch.Tensor:
        return diffusers[f"transformer.{module}.lora_B.weight"] @ diffusers[f"transformer.{module}.lora_A.weight"]

    down, up = state[f"{prefix}txt_attn.qkv.lora_down.weight"], state[f"{prefix}txt_attn.qkv.lora_up.weight"]
    fused = up @ down * (float(state[f"{prefix}txt_attn.qkv.alpha"]) / down.shape[0])
    expected = torch.cat([delta(f"transformer_blocks.1.attn.{p}") for p in ("add_q_proj", "add_k_proj", "add_v_proj")])
    assert torch.allclose(fused, expected, atol=1e-6)

    _, again = our_model(method=True, lora_model_name=str(path), output_model_format="COMFY_LORA")
    _, reference = our_model(method=True, lora_model_name=config["output_model_destination"])
    assert torch.allclose(transformer_output(again.part("transformer")),
                          transformer_output(reference.part("transformer")), atol=1e-6)  # fmt: skip
