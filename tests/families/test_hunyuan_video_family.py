"""HunyuanVideo on its tiny model, a video family on the shared 5-D path: the conditioning (the Llama through the
pipeline's prompt template, cropped; CLIP-L pooled), the 5-D latents of clips (scaled) and the prediction with the
guidance input are HunyuanVideoPipeline's; the text cache keeps each caption's tokens; caption dropout keeps the mask;
a folder of clips and a still trains a LoRA from the CLI (`scripts/train.py`'s main), its clips' latents cached 5-D,
and the DIFFUSERS_LORA file loads in `HunyuanVideoPipeline.load_lora_weights` with every module landing, as ours; the
same adapters as COMFY_LORA (diffusion-pipe's layout that ComfyUI maps) and KOHYA_LORA (musubi-tuner's) read back as
trained, the COMFY_LORA file's double blocks through diffusers' converter too; samples are clips of the sample's
frames as the pipeline renders them; LoHa and LoKr train; a fine-tune writes a folder that loads in diffusers and back;
an embedding trains on both text encoders; layer offloading with checkpointing, 8-bit weights and validation work on
clips."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from onetrainer.families.hunyuan_video import TEXT_TOKENS, HunyuanVideoState
from onetrainer.sampling.clip import SampleClip
from tests.families.tiny_video_family import CLIP_SAMPLE, TinyVideoFamily

VARIANT = "hunyuan-video"
CAPTIONS = ["a red circle and a cat", "Two BLUE squares on a table, seen from above at dusk"]


def transformer_output(transformer: torch.nn.Module) -> torch.Tensor:
    """Two clips of 2 latent frames of 4x6, 7 text tokens (the second caption's last 2 masked), CLIP's pooled output,
    guidance 1."""
    config = transformer.config
    generator = torch.Generator().manual_seed(0)
    latents = torch.randn(2, config.in_channels, 2, 4, 6, generator=generator)
    text = torch.randn(2, 7, config.text_embed_dim, generator=generator)
    pooled = torch.randn(2, config.pooled_projection_dim, generator=generator)
    mask = torch.tensor([[1] * 7, [1] * 5 + [0] * 2])
    with torch.no_grad():
        return transformer(
            latents, torch.tensor([300.0, 800.0]), text, mask, pooled, guidance=torch.tensor([1000.0, 1000.0]),
            return_dict=False,
        )[0]  # fmt: skip


FAMILY = TinyVideoFamily(
    VARIANT, "HunyuanVideoPipeline", transformer_output, frozen_text=("text_encoder", "text_encoder_2")
)
our_model, pipeline = FAMILY.our_model, FAMILY.pipeline


def test_the_conditioning_the_latents_and_the_prediction_are_the_pipelines():
    family, model = our_model()
    pipe = pipeline()
    with torch.no_grad():
        ours = family.encode_text(model, CAPTIONS)
        embeds, pooled, mask = pipe.encode_prompt(list(CAPTIONS), device="cpu")
        assert ours.hidden_states.shape == (2, TEXT_TOKENS, 48) and ours.pooled.shape == (2, 32)
        assert torch.equal(ours.hidden_states, embeds)  # the template's tokens cropped off, the third-last layer
        assert torch.equal(ours.tensors["attention_mask"], mask) and torch.equal(ours.pooled, pooled)
        lengths = mask.sum(dim=1)
        assert 0 < int(lengths[0]) < int(lengths[1]) < TEXT_TOKENS

        clips = torch.rand(2, 3, 5, 48, 64) * 2 - 1
        latents = family.encode_images(model, clips)
        raw = pipe.vae.encode(clips).latent_dist.mode()
        assert latents.shape == (2, 16, 2, 6, 8)  # 5 frames → 1 + 1 latent frames, 8x spatial
        assert torch.allclose(latents, raw * pipe.vae.config.scaling_factor, atol=1e-6)  # what the pipeline decodes
        still = family.encode_images(model, clips[:, :, 0])  # a still is a one-frame clip
        assert still.shape == (2, 16, 1, 6, 8)

        sigma = torch.tensor([0.25, 0.75])
        noisy = torch.randn(2, 16, 2, 6, 8)
        assert model.family_state(HunyuanVideoState).guidance == 1.0  # transformer.guidance_scale, OneTrainer's 1.0
        predicted = family.predict(model, noisy, model.schedule.model_time(sigma), ours, {}).output
        guidance = torch.tensor([1000.0, 1000.0])  # as the pipeline gives it: guidance_scale · 1000
        theirs = pipe.transformer(noisy, sigma * 1000, embeds, mask, pooled, guidance=guidance, return_dict=False)[0]
        other = pipe.transformer(noisy, sigma * 1000, embeds, mask, pooled, guidance=guidance * 6, return_dict=False)[0]
    assert torch.allclose(predicted, theirs, atol=1e-5)
    assert not torch.allclose(predicted, other, atol=1e-4)  # the guidance value reaches the transformer


def test_training_feeds_the_configured_guidance_as_the_pipeline_scales_it():
    """`transformer.guidance_scale` (OneTrainer's setting) reaches the transformer · 1000, as the pipeline gives its
    guidance_scale; `text_encoder.layer_skip` reads an earlier Llama layer (the pipeline's template and crop are
    ours)."""
    from diffusers.pipelines.hunyuan_video.pipeline_hunyuan_video import DEFAULT_PROMPT_TEMPLATE

    from onetrainer.families.hunyuan_video import CROP_START, PROMPT_TEMPLATE

    assert (DEFAULT_PROMPT_TEMPLATE["template"], DEFAULT_PROMPT_TEMPLATE["crop_start"]) == (PROMPT_TEMPLATE, CROP_START)
    family, model = our_model(transformer={"guidance_scale": 3.5}, text_encoder={"layer_skip": 1})
    assert model.family_state(HunyuanVideoState).guidance == 3.5
    pipe = pipeline()
    with torch.no_grad():
        ours = family.encode_text(model, CAPTIONS)
        embeds, mask = pipe._get_llama_prompt_embeds(
            list(CAPTIONS), DEFAULT_PROMPT_TEMPLATE, device="cpu", num_hidden_layers_to_skip=3
        )
        assert torch.equal(ours.hidden_states, embeds)  # one layer earlier than the pipeline's default
        noisy, times = torch.randn(2, 16, 1, 2, 2), torch.tensor([100.0, 900.0])
        predicted = family.predict(model, noisy, times, ours, {}).output
        theirs = pipe.transformer(
            noisy, times, ours.hidden_states, mask, ours.pooled, guidance=torch.tensor([3500.0, 3500.0]),
            return_dict=False,
        )[0]  # fmt: skip
    assert torch.allclose(predicted, theirs, atol=1e-5)


def test_the_text_cache_keeps_each_captions_tokens_and_predicts_the_same():
    _, lengths = FAMILY.assert_cached_text_predicts_as_encoded(CAPTIONS, (2, 16, 1, 2, 2), atol=1e-5)
    assert lengths[0] != lengths[1]


def test_caption_dropout_zeroes_each_encoders_share_and_keeps_the_mask():
    family, model = our_model()
    with torch.no_grad():
        encoded = family.encode_text(model, CAPTIONS)
        dropped = family.drop_captions(
            model, CAPTIONS, [torch.tensor([True, False]), torch.tensor([False, True])],
            lambda captions: family.encode_text(model, captions),
        )  # fmt: skip
        assert not dropped.hidden_states[0].any() and torch.equal(dropped.hidden_states[1], encoded.hidden_states[1])
        assert torch.equal(dropped.pooled[0], encoded.pooled[0]) and not dropped.pooled[1].any()
        assert torch.equal(dropped.tensors["attention_mask"], encoded.tensors["attention_mask"])
        prediction = family.predict(model, torch.randn(2, 16, 1, 2, 2), torch.tensor([100.0, 900.0]), dropped, {})
    assert torch.isfinite(prediction.output).all()


def test_samples_are_clips_of_the_samples_frames_as_the_pipeline_renders_them():
    import numpy as np
    from diffusers import FlowMatchEulerDiscreteScheduler

    from onetrainer.config.sample_config import SampleConfig
    from onetrainer.sampling.sampler import render

    family, model = our_model()
    assert isinstance(family.own_sampler(model), FlowMatchEulerDiscreteScheduler)
    assert family.own_sampler(model).config.shift == 7.0
    for frames, expected in ((6, 5), (1, 1)):  # 4k + 1, rounded down
        sample = SampleConfig(prompt="a cat", width=64, height=48, frames=frames, seed=3, diffusion_steps=2,
                              cfg_scale=6.0)  # fmt: skip
        clip = render(family, model, sample)
        assert isinstance(clip, SampleClip) and len(clip.frames) == expected and clip.fps == 24.0
        assert all(frame.size == (64, 48) for frame in clip.frames)

    pipe = pipeline()
    settings = {"height": 48, "width": 64, "num_inference_steps": 2, "guidance_scale": 6.0}
    output = pipe(
        prompt="a cat", num_frames=5, generator=torch.Generator().manual_seed(3), output_type="np", **settings
    )
    sample = SampleConfig(prompt="a cat", width=64, height=48, frames=5, seed=3, diffusion_steps=2, cfg_scale=6.0)
    ours = render(family, model, sample)
    theirs = (np.clip(output.frames[0], 0, 1) * 255).round().astype(np.uint8)
    assert max(int(np.abs(np.asarray(f).astype(int) - t.astype(int)).max()) for f, t in zip(ours.frames, theirs)) <= 1


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    """A DIFFUSERS_LORA on the blocks' attention and feed-forward (`attn-mlp`), from `scripts/train.py`'s main with a
    config file: a folder of two clips (5-frame windows) and a still, latents and captions cached, a sample."""
    root = tmp_path_factory.mktemp("hunyuan-video-lora")
    return root, FAMILY.cli_lora_run(root, {**CLIP_SAMPLE, "cfg_scale": 6.0})


def test_clips_and_a_still_train_from_the_cli_with_5d_latents_cached(lora_run):
    FAMILY.assert_clips_cached_and_sampled(*lora_run)


def test_every_module_of_the_diffusers_lora_lands_in_the_pipeline_as_ours(lora_run):
    path, _, modules = FAMILY.diffusers_lora(lora_run[1])
    assert {
        "transformer_blocks.0.attn.to_q",
        "transformer_blocks.0.attn.add_k_proj",
        "transformer_blocks.0.ff.net.2",
        "single_transformer_blocks.0.proj_mlp",
        "single_transformer_blocks.0.attn.to_v",
        "context_embedder.token_refiner.refiner_blocks.1.attn.to_out.0",
    } <= modules
    FAMILY.assert_lora_lands_in_the_pipeline_as_ours(path, modules)


save_as = FAMILY.save_lora_as


@pytest.mark.parametrize("fmt", ["COMFY_LORA", "KOHYA_LORA"])
def test_comfyui_and_musubi_layouts_read_back_as_trained(lora_run, tmp_path, fmt):
    """The trained adapters written over the original module names, fused q/k/v and linear1 as one exact LoRA each:
    diffusion-pipe's layout that ComfyUI maps (`diffusion_model.double_blocks.N.img_attn_qkv.lora_A.weight`, the
    scale folded, no alpha) or musubi-tuner's (`lora_unet_double_blocks_N_img_attn_qkv`); ours reads each back to the
    transformer the DIFFUSERS_LORA gives."""
    _, config = lora_run
    path = tmp_path / "lora.safetensors"
    state = save_as(config, path, fmt)
    if fmt == "COMFY_LORA":
        assert {
            "diffusion_model.double_blocks.0.img_attn_qkv.lora_A.weight",
            "diffusion_model.double_blocks.0.txt_attn_qkv.lora_B.weight",
            "diffusion_model.double_blocks.0.img_mlp.fc2.lora_B.weight",
            "diffusion_model.single_blocks.0.linear1.lora_A.weight",
            "diffusion_model.txt_in.individual_token_refiner.blocks.1.self_attn_qkv.lora_B.weight",
        } <= state.keys()
        assert all(k.startswith("diffusion_model.") and k.endswith((".lora_A.weight", ".lora_B.weight")) for k in state)
    else:
        assert {
            "lora_unet_double_blocks_0_img_attn_qkv.lora_down.weight",
            "lora_unet_double_blocks_0_txt_attn_proj.alpha",
            "lora_unet_single_blocks_0_linear1.lora_up.weight",
            "lora_unet_txt_in_individual_token_refiner_blocks_0_mlp_fc1.lora_down.weight",
        } <= state.keys()
    qkv = "diffusion_model.double_blocks.0.img_attn_qkv.lora_A.weight"
    assert fmt != "COMFY_LORA" or state[qkv].shape[0] == 3 * 4  # q, k and v's rank-4 adapters, block-diagonal
    _, expected = our_model(method=True, lora_model_name=config["output_model_destination"])
    _, again = our_model(method=True, lora_model_name=str(path), output_model_format=fmt)
    assert torch.allclose(transformer_output(again.part("transformer")),
                          transformer_output(expected.part("transformer")), atol=1e-5)  # fmt: skip


def test_diffusers_converter_reads_the_comfy_files_double_blocks_as_ours(lora_run, tmp_path):
    """diffusers' `_convert_hunyuan_video_lora_to_diffusers` (HunyuanVideoPipeline.load_lora_weights) reads the
    COMFY_LORA file's double blocks exactly (its split of a single block's linear1 is fixed at the released width,
    3072, and it splits a refiner's fused q/k/v down matrix too: those parts are left to ComfyUI and to ours)."""
    _, config = lora_run
    state = save_as(config, tmp_path / "lora.safetensors", "COMFY_LORA")
    double = {k: v for k, v in state.items() if k.startswith("diffusion_model.double_blocks.")}
    theirs = pipeline()
    theirs.load_lora_weights(double)
    reference = pipeline()
    diffusers_state = load_file(config["output_model_destination"])
    reference.load_lora_weights(
        {k: v for k, v in diffusers_state.items() if k.startswith("transformer.transformer_blocks.")}
    )
    assert torch.allclose(transformer_output(theirs.transformer), transformer_output(reference.transformer), atol=1e-5)
    assert not torch.allclose(transformer_output(theirs.transformer), transformer_output(pipeline().transformer),
                              atol=1e-4)  # fmt: skip


@pytest.mark.parametrize("kind", ["loha", "lokr"])
def test_lycoris_kinds_train_on_clips_and_read_back_as_trained(tmp_path, monkeypatch, kind):
    """LoHa and LoKr on the double blocks' attention in COMFY_LORA: a whole original module under
    `diffusion_model.<original path>` (`img_attn_proj`), each projection of a fused q/k/v under
    `lora_transformer_<diffusers path>`; read back into a fresh model they give the trained transformer."""
    state, marker, config, trained, _ = FAMILY.train_clip_adapter(
        tmp_path, monkeypatch, kind, layer_filter="^transformer_blocks\\.\\d+\\.attn\\.", layer_filter_regex=True
    )
    assert f"diffusion_model.double_blocks.0.img_attn_proj.{marker}" in state
    assert f"lora_transformer_transformer_blocks_0_attn_to_q.{marker}" in state
    FAMILY.assert_file_reads_back_as_trained(config, kind, trained, atol=1e-5)


def test_a_fine_tune_writes_a_folder_that_loads_in_diffusers_and_back(tmp_path):
    import json

    from diffusers import FlowMatchEulerDiscreteScheduler

    FAMILY.fine_tune_clips(tmp_path)
    frozen = ("text_encoder", "text_encoder_2", "vae")
    trained, _ = FAMILY.assert_fine_tune_round_trips(tmp_path / "out" / "model", *frozen)  # in diffusers and back
    assert isinstance(trained.scheduler, FlowMatchEulerDiscreteScheduler) and trained.scheduler.config.shift == 7.0
    index = json.loads((tmp_path / "out" / "model" / "model_index.json").read_text())
    assert index["_class_name"] == "HunyuanVideoPipeline"


def test_an_embedding_trains_on_both_encoders_and_prompts_the_pipeline_as_ours(tmp_path):
    """The file holds the vectors under `llama` and `clip_l` (OneTrainer's keys); set into diffusers' tokenizers and
    encoders as new tokens (the pipeline has no textual-inversion loader), they give our conditioning."""
    vectors, family, model, method = FAMILY.trained_embedding(tmp_path)  # the run continues from the file
    assert {"llama", "clip_l"} <= vectors.keys()
    pipe = pipeline()
    for tokenizer, encoder, key in ((pipe.tokenizer, pipe.text_encoder, "llama"),
                                    (pipe.tokenizer_2, pipe.text_encoder_2, "clip_l")):  # fmt: skip
        tokens = ["<shape>"] + [f"<shape>_{i}" for i in range(1, len(vectors[key]))]
        tokenizer.add_tokens(tokens)
        encoder.resize_token_embeddings(len(tokenizer))
        with torch.no_grad():
            table = encoder.get_input_embeddings().weight
            for token, vector in zip(tokens, vectors[key], strict=True):
                table[tokenizer.convert_tokens_to_ids(token)] = vector
    prompt = "a photo of " + " ".join(["<shape>"] + [f"<shape>_{i}" for i in range(1, len(vectors["llama"]))])
    with torch.no_grad():
        ours = family.encode_text(model, [method.embeddings.apply("a photo of <shape>")])
        embeds, pooled, _ = pipe.encode_prompt([prompt], device="cpu")
    assert torch.allclose(ours.hidden_states, embeds, atol=1e-5) and torch.allclose(ours.pooled, pooled, atol=1e-5)


def test_layer_offloading_with_checkpointing_trains_the_same_lora(tmp_path, monkeypatch):
    """Half of the transformer's double- and single-stream blocks and the Llama's layers waiting off the device,
    gradient checkpointing on: the same losses and LoRA as without (stills as one-frame clips, their latents 5-D)."""
    from tests.helpers import assert_offloading_trains_the_same_lora

    assert_offloading_trains_the_same_lora(
        tmp_path, monkeypatch, VARIANT, {"HunyuanVideoTransformer3DModel", "LlamaModel"}
    )


def test_clips_train_with_8_bit_weights_and_validate(tmp_path):
    """A LoRA over a float8 transformer and int8 text encoders, on clips: it trains (finite losses), validates on the
    clip held out (its 5-D latents at fixed times) and writes its file."""
    from onetrainer.training.events import Metrics, Validated
    from tests.helpers import run_config

    config = FAMILY.clip_config(
        tmp_path, "LORA", epochs=1, learning_rate=1e-2, output_model_format="KOHYA_LORA",
        layer_filter_preset="attn-only", transformer={"weight_dtype": "FLOAT_8"},
        text_encoder={"train": False, "weight_dtype": "INT_8"},
        text_encoder_2={"train": False, "weight_dtype": "INT_8"},
        validation=True, validation_holdout=1, validate_after=1, validate_after_unit="EPOCH",
    )  # fmt: skip
    events = run_config(config)
    losses = [e.loss for e in events if isinstance(e, Metrics)]
    assert losses and all(torch.isfinite(torch.tensor(losses)))
    (validated,) = [e for e in events if isinstance(e, Validated)]
    assert torch.isfinite(torch.tensor(validated.loss))
    assert "lora_unet_double_blocks_0_img_attn_qkv.lora_down.weight" in load_file(config["output_model_destination"])
