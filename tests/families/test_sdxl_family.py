"""SDXL 1.0 (+ inpainting): loading from every kind of source offline, the two text encoders, the size and crop
conditioning, and our denoiser inputs checked against diffusers' own SDXL pipelines."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from diffusers import DDIMScheduler, StableDiffusionXLPipeline

from onetrainer.config import config_from_dict
from onetrainer.families.base import BatchInputs
from onetrainer.families.loading import ModelLoadError
from onetrainer.families.sd import StableDiffusionFamily
from onetrainer.families.sdxl import StableDiffusionXLFamily
from onetrainer.families.text_encoding import pool_at_end_token
from onetrainer.sampling.sampler import looks_broken, render, to_image
from onetrainer.tiny import tiny_model_dir
from onetrainer.weights.checkpoint_files import load_state_dict
from tests.helpers import local_config

FAMILY = StableDiffusionXLFamily()
BASE = "STABLE_DIFFUSION_XL_10_BASE"
INPAINTING = "STABLE_DIFFUSION_XL_10_BASE_INPAINTING"


def config(**data):
    cfg, problems = config_from_dict(
        {"base_model_name": "tiny:sdxl", "model_type": BASE, "train_device": "cpu", **data}
    )
    assert [p for p in problems if p.is_error] == []
    return local_config(cfg)


@pytest.fixture(scope="module")
def model():
    """The tiny SDXL base model; tests that change it load their own."""
    return FAMILY.load(config())


@pytest.fixture(scope="module")
def diffusers_pipe():
    pipe = StableDiffusionXLPipeline.from_pretrained(str(tiny_model_dir("sdxl")))
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.fixture(scope="module")
def single_file(tmp_path_factory, model):
    path = tmp_path_factory.mktemp("sdxl-single") / "sdxl.safetensors"
    FAMILY.save_single_file(model, path, torch.float32)
    return path


def batch_inputs(sizes, offsets, pixels, masks=None, latents=None) -> BatchInputs:
    """A batch's inputs as the trainer gives them to `batch_extras` (latents at 1/8 of the pixels)."""
    if latents is None:
        latents = torch.zeros(len(pixels), 4, pixels.shape[-2] // 8, pixels.shape[-1] // 8)
    keep_unmasked = torch.zeros(len(latents), dtype=torch.bool)
    return BatchInputs(latents, pixels, sizes, offsets, masks, keep_unmasked)


def unet_output(m, caption: str = "a photo") -> torch.Tensor:
    torch.manual_seed(0)
    x = torch.randn(1, m.part("unet").config.in_channels, 8, 8)
    with torch.no_grad():
        conditioning = FAMILY.encode_text(m, [caption])
        extra = FAMILY.batch_extras(m, batch_inputs([(96, 64)], [(16, 0)], torch.zeros(1, 3, 64, 64)))
        return FAMILY.predict(m, x, torch.tensor([321]), conditioning, extra).output


def latents(pipe, prompt: str = "a red circle", **kwargs) -> torch.Tensor:
    pipe.scheduler = DDIMScheduler.from_config(pipe.scheduler.config)
    pipe.set_progress_bar_config(disable=True)
    arguments = {"height": 64, "width": 64, "num_inference_steps": 1, "guidance_scale": 3.0, **kwargs}
    with torch.no_grad():
        return pipe(prompt, generator=torch.Generator().manual_seed(0), output_type="latent", **arguments).images


def ours(m):
    for module in m.parts.values():
        module.eval()
    return FAMILY.pipeline(m, DDIMScheduler.from_config(m.schedule.scheduler_config))


# -- conditioning ------------------------------------------------------------------------------------------------


def test_prediction_matches_diffusers_conditioning(model, diffusers_pipe):
    """Our text encoding, pooled embedding and time ids give the UNet what diffusers' SDXL pipeline gives it."""
    pipe = diffusers_pipe
    with torch.no_grad():
        embeds, _, pooled, _ = pipe.encode_prompt("a photo", do_classifier_free_guidance=False)
        ids = pipe._get_add_time_ids(
            (96, 64), (16, 0), (64, 64), embeds.dtype, pipe.text_encoder_2.config.projection_dim
        )
        torch.manual_seed(0)
        x = torch.randn(1, 4, 8, 8)
        theirs = pipe.unet(x, torch.tensor([321]), embeds, added_cond_kwargs={"text_embeds": pooled, "time_ids": ids})
    conditioning = FAMILY.encode_text(model, ["a photo"])
    assert conditioning.hidden_states.shape == (1, 77, 32 + 64) and conditioning.pooled.shape == (1, 64)
    assert torch.allclose(conditioning.hidden_states, embeds, atol=1e-6)
    assert torch.allclose(conditioning.pooled, pooled, atol=1e-6)
    assert torch.allclose(unet_output(model), theirs.sample, atol=1e-5)


def test_our_pipeline_is_diffusers_pipeline(model, diffusers_pipe):
    assert torch.allclose(latents(ours(model)), latents(diffusers_pipe), atol=1e-5)


def test_time_ids_come_from_the_batch(model):
    m = model
    sizes, offsets = [(100, 80), (64, 64)], [(3, 0), (0, 5)]
    extra = FAMILY.batch_extras(m, batch_inputs(sizes, offsets, torch.zeros(2, 3, 64, 64)))
    assert extra["time_ids"].tolist() == [[100, 80, 3, 0, 64, 64], [64, 64, 0, 5, 64, 64]]
    # Cached latents (no pixels): the target size is the latents' size times the VAE's scale.
    cached = batch_inputs(sizes, offsets, None, latents=torch.zeros(2, 4, 8, 16))
    assert FAMILY.batch_extras(m, cached)["time_ids"][:, 4:].tolist() == [[64, 128], [64, 128]]


def test_clip_skip_per_encoder_counts_from_the_penultimate_layer():
    m = FAMILY.load(config(text_encoder_layer_skip=1, text_encoder_2_layer_skip=2))
    assert [slot.layer_skip for slot in m.text_encoders] == [1, 2]
    tokens = FAMILY.tokenize(m, ["a photo"])
    with torch.no_grad():
        hidden = FAMILY.encode_text(m, ["a photo"]).hidden_states
        one = m.part("text_encoder")(tokens[0], output_hidden_states=True).hidden_states
        two = m.part("text_encoder_2")(tokens[1], output_hidden_states=True).hidden_states
    assert torch.equal(hidden[..., :32], one[-3]) and torch.equal(hidden[..., 32:], two[-4])


def test_sampling_with_clip_skip_matches_diffusers(model, diffusers_pipe):
    """Equal clip skips are what diffusers' `clip_skip` does (its negative prompt would ignore it: none here)."""
    assert FAMILY.prompt_arguments(model, "a red circle", None) == {"prompt": "a red circle", "negative_prompt": None}
    for slot in model.text_encoders:
        slot.layer_skip = 1
    try:
        arguments = FAMILY.prompt_arguments(model, "a red circle", None)
        mine = latents(ours(model), None, **arguments)
    finally:
        for slot in model.text_encoders:
            slot.layer_skip = 0
    assert set(arguments) == {"prompt_embeds", "pooled_prompt_embeds", "negative_prompt_embeds",
                              "negative_pooled_prompt_embeds"}  # fmt: skip
    theirs = latents(diffusers_pipe, clip_skip=1)
    assert torch.allclose(mine, theirs, atol=1e-5)
    assert not torch.allclose(theirs, latents(diffusers_pipe), atol=1e-4)


@pytest.mark.parametrize("cached", [False, True], ids=["encoded", "text-cache"])
def test_caption_dropout_drops_each_encoders_share_on_its_own(tmp_path, model, cached):
    """Encoder 1's states are the first 32 features, encoder 2's the rest and the pooled embedding: a drop mask per
    encoder replaces only that encoder's share with the empty caption's, from the encoder or the text cache."""
    from onetrainer.data.caching import TextCache, encode_text_entries

    captions = ["a red circle", "a blue square"]
    if cached:
        text_cache = TextCache(config(cache_dir=str(tmp_path)), FAMILY, model)
        for caption, entry in zip([*captions, ""], encode_text_entries(FAMILY, model, [*captions, ""])):
            text_cache.cache.put(text_cache.key(caption), entry)

        def encode(texts):
            return text_cache.conditioning(texts, "cpu")
    else:

        def encode(texts):
            return FAMILY.encode_text(model, texts)

    with torch.no_grad():
        full, empty = encode(captions), encode([""])
        all_rows, no_rows = torch.ones(2, dtype=torch.bool), torch.tensor([False, True])
        first = FAMILY.drop_captions(model, captions, [all_rows, None], encode)
        second = FAMILY.drop_captions(model, captions, [None, all_rows], encode)
        mixed = FAMILY.drop_captions(model, captions, [no_rows, torch.zeros(2, dtype=torch.bool)], encode)
    empty_hidden = empty.hidden_states.expand_as(full.hidden_states)
    assert torch.equal(first.hidden_states[..., :32], empty_hidden[..., :32])
    assert torch.equal(first.hidden_states[..., 32:], full.hidden_states[..., 32:])
    assert torch.equal(first.pooled, full.pooled)
    assert torch.equal(second.hidden_states[..., :32], full.hidden_states[..., :32])
    assert torch.equal(second.hidden_states[..., 32:], empty_hidden[..., 32:])
    assert torch.equal(second.pooled, empty.pooled.expand_as(full.pooled))
    assert not torch.equal(full.hidden_states[..., :32], empty_hidden[..., :32])  # the test can tell them apart
    assert torch.equal(mixed.hidden_states[0], full.hidden_states[0])  # only the masked row changes
    assert torch.equal(mixed.hidden_states[1, :, :32], empty.hidden_states[0, :, :32])


def test_pooling_follows_the_end_token_not_the_highest_id(model):
    """Real CLIP configs say eos_token_id=2, which pools at the highest id: an added embedding token would win."""
    m = FAMILY.load(config())
    encoder, tokenizer = m.part("text_encoder_2"), m.text_encoders[1].tokenizer
    tokens = FAMILY.tokenize(m, ["a photo"])[1]
    with torch.no_grad():
        expected = encoder(tokens).text_embeds
        encoder.text_model.eos_token_id = encoder.config.eos_token_id = 2  # as loaded from a real checkpoint
        tokens_with_extra = tokens.clone()
        tokens_with_extra[0, 1] = len(tokenizer) + 5  # an id beyond the vocabulary: embeddings add such ids
        pool_at_end_token(encoder, tokenizer)
        assert encoder.text_model.eos_token_id == tokenizer.eos_token_id
        pooled = encoder(tokens_with_extra.clamp(max=len(tokenizer) - 1)).text_embeds
    assert not torch.allclose(pooled, expected)  # the token changed, the pooling position did not:
    position = (tokens[0] == tokenizer.eos_token_id).nonzero()[0].item()
    assert position == int((tokens_with_extra[0] == tokenizer.eos_token_id).int().argmax())


# -- sources ---------------------------------------------------------------------------------------------------------


def test_hub_id_offline_gives_a_clear_error():
    with pytest.raises(ModelLoadError, match="not in the local Hugging Face cache"):
        FAMILY.load(config(base_model_name="someone/not-a-cached-sdxl", offline_mode=True))


def test_single_file_layout_and_round_trip(single_file, model):
    state = load_state_dict(single_file)
    for key in (
        "model.diffusion_model.label_emb.0.0.weight",
        "conditioner.embedders.0.transformer.text_model.encoder.layers.0.self_attn.q_proj.weight",
        "conditioner.embedders.1.model.transformer.resblocks.0.attn.in_proj_weight",
        "conditioner.embedders.1.model.text_projection",
        "first_stage_model.decoder.conv_in.weight",
    ):
        assert key in state, key
    again = FAMILY.load(config(base_model_name=str(single_file)))
    assert torch.allclose(unet_output(again), unet_output(model), atol=1e-5)
    assert again.text_encoders[1].tokenizer.pad_token == "!" and again.text_encoders[0].tokenizer.pad_token != "!"


def test_single_file_loads_in_diffusers(single_file, model):
    pipe = StableDiffusionXLPipeline.from_single_file(
        str(single_file), config=str(tiny_model_dir("sdxl")), local_files_only=True
    )
    assert torch.allclose(latents(pipe), latents(ours(model)), atol=1e-5)


def test_fp16_single_file(tmp_path, model):
    path = tmp_path / "half.safetensors"
    FAMILY.save_single_file(model, path, torch.float16)
    assert load_state_dict(path)["model.diffusion_model.input_blocks.0.0.weight"].dtype == torch.float16
    again = FAMILY.load(config(base_model_name=str(path)))
    assert torch.allclose(unet_output(again), unet_output(model), atol=2e-2)


def test_zero_terminal_snr_single_file_carries_the_markers_comfyui_reads(tmp_path, single_file, model):
    # ComfyUI's SDXL loader: "v_pred" → v-prediction, and with it "ztsnr" → the zero-terminal-SNR schedule.
    plain = load_state_dict(single_file)
    assert "v_pred" not in plain and "ztsnr" not in plain
    zsnr = FAMILY.load(config(rescale_noise_scheduler_to_zero_terminal_snr=True))
    path = tmp_path / "zsnr.safetensors"
    FAMILY.save_single_file(zsnr, path, torch.float32)
    state = load_state_dict(path)
    assert state["v_pred"].numel() == 0 and state["ztsnr"].numel() == 0
    again = FAMILY.load(config(base_model_name=str(path), rescale_noise_scheduler_to_zero_terminal_snr=True))
    assert torch.allclose(unet_output(again), unet_output(model), atol=1e-5)


def test_checkpoints_of_another_kind_are_refused(tmp_path, single_file):
    with pytest.raises(ModelLoadError, match="not an inpainting checkpoint"):
        FAMILY.load(config(base_model_name=str(single_file), model_type=INPAINTING))
    sd15 = StableDiffusionFamily()
    sd15_config, _ = config_from_dict({"base_model_name": "tiny:sd15", "train_device": "cpu"})
    path = tmp_path / "sd15.safetensors"
    sd15.save_single_file(sd15.load(local_config(sd15_config)), path, torch.float32)
    with pytest.raises(ModelLoadError, match=r"SD 1.x / 2.x checkpoint.*STABLE_DIFFUSION_XL_10_BASE"):
        FAMILY.load(config(base_model_name=str(path)))
    with pytest.raises(ModelLoadError, match="not an SDXL model"):
        FAMILY.load(config(base_model_name="tiny:sd15"))
    with pytest.raises(ModelLoadError, match="is an inpainting model"):
        FAMILY.load(config(base_model_name="tiny:sdxl-inpainting"))


def test_backup_of_a_finetune_is_a_base_model(tmp_path, model):
    backup = tmp_path / "backup"
    FAMILY.save_diffusers(model, backup / "model", torch.float32)
    (backup / "meta.json").write_text("{}")
    again = FAMILY.load(config(base_model_name=str(backup)))
    assert torch.allclose(unet_output(again), unet_output(model))


def test_vae_is_float32_by_default_and_parts_keep_their_dtypes():
    m = FAMILY.load(config(unet={"weight_dtype": "FLOAT_16"}, text_encoder_2={"weight_dtype": "BFLOAT_16"}))
    assert next(m.part("vae").parameters()).dtype == torch.float32
    assert next(m.part("unet").parameters()).dtype == torch.float16
    assert next(m.part("text_encoder_2").parameters()).dtype == torch.bfloat16
    assert next(m.part("text_encoder").parameters()).dtype == torch.float32


# -- inpainting and samples ------------------------------------------------------------------------------------------


def test_inpainting_inputs_and_sample():
    cfg = config(base_model_name="tiny:sdxl-inpainting", model_type=INPAINTING)
    m = FAMILY.load(cfg)
    assert m.part("unet").config.in_channels == 9
    pixels = torch.rand(2, 3, 64, 64) * 2 - 1
    masks = torch.zeros(2, 1, 64, 64)
    masks[:, :, 16:48, 16:48] = 1.0
    extra = FAMILY.batch_extras(m, batch_inputs([(64, 64)] * 2, [(0, 0)] * 2, pixels, masks))
    assert extra["mask"].shape == (2, 1, 8, 8) and extra["masked_latents"].shape == (2, 4, 8, 8)
    conditioning = FAMILY.encode_text(m, ["a", "b"])
    prediction = FAMILY.predict(m, torch.randn(2, 4, 8, 8), torch.tensor([1, 999]), conditioning, extra)
    assert prediction.output.shape == (2, 4, 8, 8)
    sample = config(samples=[{"prompt": "x", "width": 64, "height": 64, "diffusion_steps": 1}]).samples[0]
    assert render(FAMILY, m, sample).size == (64, 64)


def test_a_sample_that_decodes_to_nan_is_reported(model):
    sample = config(samples=[{"prompt": "x", "width": 64, "height": 64, "diffusion_steps": 1}]).samples[0]
    # What an fp16 SDXL VAE does: its decoder overflows.
    handle = model.part("vae").decoder.register_forward_hook(lambda module, args, output: output * float("nan"))
    try:
        image = render(FAMILY, model, sample)
    finally:
        handle.remove()
    assert "NaN" in looks_broken(image)
    assert looks_broken(to_image(np.full((8, 8, 3), 0.5, dtype=np.float32))) is None


def test_the_second_text_encoder_settings_apply_to_sdxl_only():
    """The GUI shows the fields that apply: SDXL gets the second encoder's settings from the metadata alone."""
    from onetrainer.config.schema import walk
    from onetrainer.config.validation import context_of

    def applying(**data) -> set[str]:
        cfg = config(**data)
        return {f.path for f in walk(cfg) if f.applies(context_of(cfg))}

    lora = {"training_method": "LORA", "output_model_format": "KOHYA_LORA"}
    sdxl_lora = applying(**lora)
    for path in ("train", "learning_rate", "stop_training_after", "weight_dtype", "gradient_checkpointing"):
        assert f"text_encoder_2.{path}" in sdxl_lora and f"text_encoder.{path}" in sdxl_lora
    assert "text_encoder_2.layer_skip" in sdxl_lora and "text_encoder.layer_skip" in sdxl_lora
    assert "text_encoder_2.train_embedding" in applying(training_method="EMBEDDING", output_model_format="SAFETENSORS")
    sd15 = applying(**lora, model_type="STABLE_DIFFUSION_15", base_model_name="tiny:sd15")
    assert not any(p.startswith("text_encoder_2") for p in sd15)
