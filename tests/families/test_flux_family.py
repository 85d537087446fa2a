"""Flux.1 (dev, schnell, Fill) and Chroma on tiny models: our inputs checked against diffusers' own pipelines, one
LoRA training per variant through the trainer (the files it writes loaded by diffusers' `load_lora_weights` and
giving our outputs, samples rendered during training at two aspect ratios, the dev loss falling on an overfit set),
a fine-tune whose diffusers folder `FluxPipeline.from_pretrained` loads, and embeddings (`clip_l` and `t5`) that
diffusers' `load_textual_inversion` reads as we do."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from PIL import Image
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from onetrainer.config import config_from_dict
from onetrainer.config.enums import ModelFormat
from onetrainer.families import load_family_class
from onetrainer.families.base import BatchInputs
from onetrainer.families.flux import image_ids, pack, unpack
from onetrainer.families.loading import ModelLoadError
from onetrainer.methods import create_method
from onetrainer.tiny import tiny_model_dir
from onetrainer.tiny.denoiser_step import denoiser_inputs
from onetrainer.training.events import Metrics, SampleReady, Validated
from tests.helpers import VARIANT_MODEL_TYPES, image_folder, loaded_model, local_config, run_config, tiny_config

CPU = torch.device("cpu")
PIPELINES = {"flux-dev": "FluxPipeline", "flux-schnell": "FluxPipeline", "flux-fill": "FluxFillPipeline",
             "chroma": "ChromaPipeline"}  # fmt: skip
SIZES = ((64, 64), (80, 48))  # (width, height) of the samples rendered during training
OVERFIT_EPOCHS = 14


def our_model(variant: str, method: bool = False, **changes):
    """The family and the tiny model of `variant` (with the config's adapters when `method`), in eval mode."""
    data = tiny_config(Path("/nonexistent"), variant=variant, method="LORA", output_model_format="DIFFUSERS_LORA")
    return loaded_model(data, method, **changes)


def diffusers_pipeline(variant: str):
    import diffusers

    pipe = getattr(diffusers, PIPELINES[variant]).from_pretrained(str(tiny_model_dir(variant)), local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def transformer_output(transformer: torch.nn.Module) -> torch.Tensor:
    """The transformer's output on fixed inputs (a batch of two, 16 image and 16 text tokens)."""
    with torch.no_grad():
        return transformer(**denoiser_inputs(transformer)).sample


def lora_run(root: Path, variant: str, **overrides) -> tuple[dict, list]:
    """A LoRA trained on `variant` in process (the trainer, as `scripts/train.py` runs it), saved as DIFFUSERS_LORA
    unless `output_model_format` says otherwise."""
    overrides = {"epochs": 1, "output_model_format": "DIFFUSERS_LORA", **overrides}
    config = tiny_config(
        root, variant=variant, method="LORA", output_model_destination=str(root / "out" / "lora.safetensors"),
        **overrides,
    )  # fmt: skip
    return config, run_config(config)


def samples_at_two_sizes(**extra) -> dict:
    return {
        "samples": [{"prompt": "a red circle", "width": w, "height": h, "diffusion_steps": 2, "seed": 1, **extra}
                    for w, h in SIZES],
        "sample_after": 1,
        "sample_after_unit": "NEVER",
    }  # fmt: skip


def assert_samples_rendered(config: dict, events: list, count: int = 1) -> None:
    ready = [e for e in events if isinstance(e, SampleReady)]
    assert len(ready) == count * len(SIZES)
    sizes = {Image.open(e.path).size for e in ready}
    assert sizes == set(SIZES)


def assert_loads_in_diffusers_as_ours(variant: str, path: Path, text_encoder: bool = False, monkeypatch=None) -> None:
    """diffusers' `load_lora_weights` on the file gives the transformer (and the text encoder) our outputs. A kohya
    file (`monkeypatch` given) goes through diffusers' kohya converter at the tiny width (it hard-codes Flux.1's)."""
    _, ours = our_model(variant, lora_model_name=str(path), method=True)
    _, plain = our_model(variant)
    pipe = diffusers_pipeline(variant)
    if monkeypatch is not None:
        from diffusers.loaders import lora_pipeline

        from tests.weights.flux_models import kohya_lora_converter

        converter = kohya_lora_converter(dict(pipe.transformer.config))
        monkeypatch.setattr(lora_pipeline, "_convert_kohya_flux_lora_to_diffusers", converter)
    before = transformer_output(pipe.transformer)
    pipe.load_lora_weights(str(path))
    theirs = transformer_output(pipe.transformer)
    assert torch.allclose(transformer_output(ours.part("transformer")), theirs, atol=1e-5)
    assert torch.allclose(transformer_output(plain.part("transformer")), before, atol=1e-6)
    assert not torch.allclose(before, theirs, atol=1e-4)  # the LoRA trained
    if text_encoder:
        ids = torch.tensor([[49406, 1, 2, 3, 49407] + [49407] * 72])
        ids = ids.clamp(max=pipe.text_encoder.config.vocab_size - 1)
        with torch.no_grad():
            expected = ours.part("text_encoder")(ids).pooler_output
            assert torch.allclose(pipe.text_encoder(ids).pooler_output, expected, atol=1e-5)
            assert not torch.allclose(plain.part("text_encoder")(ids).pooler_output, expected, atol=1e-4)


# -- our inputs against diffusers' pipelines ---------------------------------------------------------------------------


def test_packing_and_position_ids_are_the_pipelines():
    from diffusers import FluxPipeline

    latents = torch.randn(2, 16, 8, 6)
    packed = pack(latents)
    assert torch.equal(packed, FluxPipeline._pack_latents(latents, 2, 16, 8, 6))
    assert torch.equal(unpack(packed, 8, 6), latents)
    assert torch.equal(unpack(packed, 8, 6), FluxPipeline._unpack_latents(packed, 64, 48, 8))
    assert torch.equal(image_ids(4, 3, CPU), FluxPipeline._prepare_latent_image_ids(1, 4, 3, CPU, torch.float32))


@pytest.mark.parametrize(
    ("variant", "length", "tokens"),
    [("flux-dev", 77, 77), ("flux-dev", None, 512), ("flux-schnell", None, 256)],
    ids=["dev-77-the-default", "dev-its-own-512", "schnell-its-own-256"],
)
def test_flux_text_encoding_is_the_pipelines(variant, length, tokens):
    family, model = our_model(variant, text_encoder_2_sequence_length=length)
    pipe = diffusers_pipeline(variant)
    captions = ["a red circle on a blue background", ""]
    conditioning = family.encode_text(model, captions)
    with torch.no_grad():
        hidden, pooled, _ = pipe.encode_prompt(captions, captions, max_sequence_length=tokens)
    assert conditioning.hidden_states.shape == (2, tokens, 32)
    assert torch.allclose(conditioning.hidden_states, hidden, atol=1e-4)
    assert torch.allclose(conditioning.pooled, pooled, atol=1e-5)
    assert conditioning.get("attention_mask")[1].sum() == 1  # the empty caption: its end token
    assert family.metadata_kind(model).architecture == ("flux-1-dev" if variant == "flux-dev" else "flux-1-schnell")


def test_chroma_text_encoding_and_mask_are_the_pipelines():
    family, model = our_model("chroma")
    pipe = diffusers_pipeline("chroma")
    captions = ["a red circle", "a green square on a white background"]
    conditioning = family.encode_text(model, captions)
    with torch.no_grad():
        hidden, mask = pipe._get_t5_prompt_embeds(captions, max_sequence_length=512, device=CPU)
    assert torch.allclose(conditioning.hidden_states, hidden, atol=1e-4)
    assert torch.equal(conditioning.get("attention_mask").float(), mask.float())
    lengths = [len(model.text_encoders[0].tokenizer(c).input_ids) for c in captions]
    assert conditioning.get("attention_mask").sum(dim=1).tolist() == [n + 1 for n in lengths]  # + one padding token


def test_chroma_trims_the_unused_padding_with_the_same_prediction():
    family, model = our_model("chroma")
    conditioning = family.encode_text(model, ["a red circle", "a green square on a white background"])
    latents = torch.randn(2, 16, 8, 8, generator=torch.Generator().manual_seed(0))
    times = torch.tensor([250.0, 800.0])
    with torch.no_grad():
        trimmed = family.predict(model, latents, times, conditioning, {}).output
        # the transformer on the whole 512 tokens, masked as ChromaPipeline masks them
        mask = conditioning.get("attention_mask").bool()
        full = model.part("transformer")(
            hidden_states=pack(latents), encoder_hidden_states=conditioning.hidden_states, timestep=times / 1000,
            img_ids=image_ids(4, 4, CPU), txt_ids=torch.zeros(512, 3),
            attention_mask=torch.cat([mask, torch.ones(2, 16, dtype=torch.bool)], dim=1),
        ).sample  # fmt: skip
    assert torch.allclose(trimmed, unpack(full, 8, 8), atol=1e-5)


def test_fill_inputs_are_the_pipelines_masked_latents_and_mask():
    family, model = our_model("flux-fill")
    pipe = diffusers_pipeline("flux-fill")
    generator = torch.Generator().manual_seed(0)
    pixels = torch.rand(1, 3, 64, 48, generator=generator) * 2 - 1
    masks = torch.zeros(1, 1, 64, 48)
    masks[..., 8:40, 16:48] = 1.0
    latents = family.encode_images(model, pixels)
    inputs = BatchInputs(latents, pixels, [(64, 48)], [(0, 0)], masks, torch.zeros(1, dtype=torch.bool))
    extra = family.batch_extras(model, inputs)
    assert set(extra) == {"guidance", "masked_latents", "mask"} and extra["mask"].shape == (1, 64, 8, 6)
    with torch.no_grad():
        # the masked image's latents as the pipeline takes them ready-made (its own encoding samples them)
        unscaled = pipe.vae.encode(pixels * (1 - masks)).latent_dist.mode()
        theirs_mask, theirs_latents = pipe.prepare_mask_latents(
            masks, unscaled, 1, 16, 1, 64, 48, torch.float32, CPU, None
        )
    ours = pack(torch.cat([extra["masked_latents"], extra["mask"]], dim=1))
    assert torch.allclose(ours, torch.cat([theirs_latents, theirs_mask], dim=-1), atol=1e-5)
    # cached (the masked image's latents encoded once) or not: the same inputs
    cached = family.cache_extras(model, pixels, masks)
    from_cache = BatchInputs(latents, None, [(64, 48)], [(0, 0)], masks, torch.zeros(1, dtype=torch.bool), cached)
    assert torch.allclose(family.batch_extras(model, from_cache)["masked_latents"], extra["masked_latents"])
    assert family.metadata_kind(model).architecture == "flux-1-fill-dev"


def test_caption_dropout_zeroes_each_encoders_share_and_keeps_the_masks():
    family, model = our_model("flux-dev")
    captions = ["a red circle", "a blue square"]
    full = family.encode_text(model, captions)
    dropped = family.drop_captions(
        model, captions, [torch.tensor([True, False]), torch.tensor([False, True])],
        lambda c: family.encode_text(model, c),
    )  # fmt: skip
    assert not dropped.pooled[0].any() and torch.equal(dropped.pooled[1], full.pooled[1])
    assert not dropped.hidden_states[1].any() and torch.equal(dropped.hidden_states[0], full.hidden_states[0])
    assert torch.equal(dropped.get("attention_mask"), full.get("attention_mask"))


def test_force_attention_mask_zeroes_t5s_padding_in_training_and_samples():
    from onetrainer.families.base import Conditioning

    family, masked = our_model("flux-dev", transformer={"attention_mask": True})
    _, plain = our_model("flux-dev")
    conditioning = family.encode_text(plain, ["a red circle"])
    mask = conditioning.get("attention_mask")
    zeroed = Conditioning({**conditioning.tensors, "hidden_states": conditioning.hidden_states * mask[..., None]})
    latents, times = torch.randn(1, 16, 8, 8, generator=torch.Generator().manual_seed(0)), torch.tensor([500.0])
    with torch.no_grad():
        ours = family.predict(masked, latents, times, conditioning, {}).output
        assert torch.equal(ours, family.predict(plain, latents, times, zeroed, {}).output)
        assert not torch.allclose(ours, family.predict(plain, latents, times, conditioning, {}).output, atol=1e-4)
        embeds = family.prompt_arguments(masked, "a red circle", None)["prompt_embeds"]
    assert not embeds[0, int(mask.sum()) :].any() and embeds[0, : int(mask.sum())].any()


def test_a_model_of_another_type_is_refused_with_what_to_choose():
    with pytest.raises(ModelLoadError, match="ChromaTransformer2DModel"):
        our_model("chroma", model_type="FLUX_DEV_1")
    with pytest.raises(ModelLoadError, match="an inpainting"):
        our_model("flux-fill", model_type="FLUX_DEV_1")


# -- training ----------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dev_run(tmp_path_factory):
    """Flux dev: a LoRA on the transformer (the text cached), overfit on two images, samples at the end at two
    sizes."""
    root = tmp_path_factory.mktemp("flux-dev")
    image_folder(root, count=2)
    overrides = samples_at_two_sizes()
    overrides["sample_after"], overrides["sample_after_unit"] = OVERFIT_EPOCHS, "EPOCH"
    # Validated every epoch on the trained images themselves (a VALIDATION concept of the same folder).
    concepts = [
        {"name": "shapes", "path": str(root / "images"), "seed": 7},
        {"name": "check", "path": str(root / "images"), "type": "VALIDATION", "seed": 7},
    ]
    config, events = lora_run(root, "flux-dev", epochs=OVERFIT_EPOCHS, learning_rate=1e-2, lora_rank=8,
                              text_encoder={"train": False}, text_encoder_2={"train": False}, concepts=concepts,
                              validation=True, validate_after=1, validate_after_unit="EPOCH", **overrides)  # fmt: skip
    return config, events


def test_dev_lora_loss_falls_and_samples_render(dev_run):
    config, events = dev_run
    losses = [e.loss for e in events if isinstance(e, Metrics)]
    assert len(losses) == OVERFIT_EPOCHS and all(torch.isfinite(torch.tensor(losses)))
    assert sum(losses[-5:]) < 0.9 * sum(losses[:5]), losses
    assert_samples_rendered(config, events)


def test_dev_validation_follows_the_flow_schedule_and_falls_as_it_overfits(dev_run):
    _, events = dev_run
    validated = [e for e in events if isinstance(e, Validated)]
    assert len(validated) == OVERFIT_EPOCHS
    for event in validated:  # σ at the middle of each quarter: four different losses, their mean the loss
        assert len(set(event.ranges.values())) == 4 and event.loss == pytest.approx(sum(event.ranges.values()) / 4)
    assert validated[-1].loss < 0.9 * validated[0].loss, [e.loss for e in validated]


def test_dev_lora_file_loads_in_diffusers_as_ours(dev_run):
    config, _ = dev_run
    path = Path(config["output_model_destination"])
    state = load_file(str(path))
    assert any(k.startswith("transformer.single_transformer_blocks.1.") for k in state)
    assert all(k.startswith("transformer.") and (".lora_A." in k or ".lora_B." in k) for k in state)
    with safe_open(str(path), "pt") as f:  # a flow model: no SD prediction type (kohya's sd-scripts writes none)
        metadata = f.metadata()
    assert metadata["modelspec.architecture"] == "flux-1-dev/lora" and "modelspec.prediction_type" not in metadata
    assert_loads_in_diffusers_as_ours("flux-dev", path)


def test_schnell_lora_on_the_attention_clip_and_t5(tmp_path):
    image_folder(tmp_path, count=2)
    config, events = lora_run(tmp_path, "flux-schnell", layer_filter_preset="attn-only",
                              text_encoder={"train": True}, text_encoder_2={"train": True})  # fmt: skip
    assert [e for e in events if isinstance(e, Metrics)]
    path = Path(config["output_model_destination"])
    state = load_file(str(path))
    targets = {k.rsplit(".lora_", 1)[0] for k in state if k.startswith("transformer.")}
    assert targets and all(".attn." in t for t in targets)
    # CLIP-L's names keep its `text_model.` level (what diffusers has written and ComfyUI maps), whichever transformers
    assert any(k.startswith("text_encoder.text_model.encoder.layers.11.") for k in state)
    assert all(k.startswith("text_encoder.text_model.") for k in state if k.startswith("text_encoder."))
    assert any(k.startswith("text_encoder_2.encoder.block.23.") for k in state)
    # diffusers' loader reads the transformer's and CLIP's parts (not T5's); we read all three
    assert_loads_in_diffusers_as_ours("flux-schnell", path, text_encoder=True)
    family, ours = our_model("flux-schnell", lora_model_name=str(path), method=True)
    _, plain = our_model("flux-schnell")
    assert not torch.allclose(
        family.encode_text(ours, ["a red circle"]).hidden_states,
        family.encode_text(plain, ["a red circle"]).hidden_states,
        atol=1e-4,
    )


def test_fill_kohya_lora_trains_on_the_masks_and_loads_in_diffusers_as_ours(tmp_path, monkeypatch):
    """Fill with KOHYA_LORA on the attention and MLPs, CLIP and T5: the original names (fused q/k/v and linear1 as
    one exact LoRA each), read by diffusers and by us; OneTrainer's `lora_te2_` names for T5 are read too."""
    image_folder(tmp_path, count=4)  # two of the four images have masks
    assert len(list((tmp_path / "images").glob("*-masklabel.png"))) == 2
    overrides = samples_at_two_sizes()
    overrides["sample_after"], overrides["sample_after_unit"] = 1, "EPOCH"
    config, events = lora_run(tmp_path, "flux-fill", output_model_format="KOHYA_LORA", layer_filter_preset="attn-mlp",
                              text_encoder={"train": True}, text_encoder_2={"train": True}, **overrides)  # fmt: skip
    assert len([e for e in events if isinstance(e, Metrics)]) == 2
    assert_samples_rendered(config, events)
    path = Path(config["output_model_destination"])
    state = load_file(str(path))
    names = {k.partition(".")[0] for k in state}
    assert {"lora_unet_double_blocks_1_img_attn_qkv", "lora_unet_double_blocks_0_txt_attn_qkv",
            "lora_unet_single_blocks_1_linear1", "lora_unet_double_blocks_0_img_mlp_0",
            "lora_te1_text_model_encoder_layers_11_self_attn_q_proj",
            "lora_te3_encoder_block_23_layer_0_SelfAttention_q"} <= names  # fmt: skip
    assert not any(n.startswith("lora_transformer_") for n in names)
    assert_loads_in_diffusers_as_ours("flux-fill", path, text_encoder=True, monkeypatch=monkeypatch)

    family, ours = our_model("flux-fill", lora_model_name=str(path), method=True)
    legacy = tmp_path / "legacy.safetensors"
    save_file({k.replace("lora_te3_", "lora_te2_"): v for k, v in state.items()}, str(legacy))
    _, again = our_model("flux-fill", lora_model_name=str(legacy), method=True)
    _, plain = our_model("flux-fill")
    caption = ["a red circle"]
    t5 = family.encode_text(ours, caption).hidden_states
    assert torch.equal(family.encode_text(again, caption).hidden_states, t5)
    assert not torch.allclose(family.encode_text(plain, caption).hidden_states, t5, atol=1e-4)


def test_chroma_kohya_lora_with_caption_dropout_samples_with_a_negative_prompt(tmp_path, monkeypatch):
    image_folder(tmp_path, count=2)
    overrides = samples_at_two_sizes(negative_prompt="blurry", cfg_scale=4.0)
    overrides["sample_after"], overrides["sample_after_unit"] = 1, "EPOCH"
    config, events = lora_run(tmp_path, "chroma", output_model_format="KOHYA_LORA", layer_filter_preset="attn-mlp",
                              text_encoder={"train": False, "dropout_probability": 0.5}, **overrides)  # fmt: skip
    assert_samples_rendered(config, events)
    path = Path(config["output_model_destination"])
    names = {k.partition(".")[0] for k in load_file(str(path))}
    assert "lora_unet_single_blocks_0_linear1" in names and all(n.startswith("lora_unet_") for n in names)
    assert_loads_in_diffusers_as_ours("chroma", path, monkeypatch=monkeypatch)


def test_fine_tune_writes_a_diffusers_folder_flux_pipeline_loads(tmp_path):
    from diffusers import FluxPipeline

    image_folder(tmp_path, count=2)
    folder = tmp_path / "out" / "model"
    config = tiny_config(tmp_path, variant="flux-schnell", method="FINE_TUNE", output_model_format="DIFFUSERS",
                         output_model_destination=str(folder), epochs=1, learning_rate=1e-3,
                         text_encoder={"train": False}, text_encoder_2={"train": False})  # fmt: skip
    run_config(config)
    pipe = FluxPipeline.from_pretrained(str(folder), local_files_only=True)
    trained = pipe.transformer.state_dict()
    base = diffusers_pipeline("flux-schnell").transformer.state_dict()
    assert not torch.equal(trained["proj_out.weight"], base["proj_out.weight"])
    # and the folder is a base model of ours again
    _, again = our_model("flux-schnell", base_model_name=str(folder), model_type=VARIANT_MODEL_TYPES["flux-schnell"])
    assert all(torch.equal(v, trained[k]) for k, v in again.part("transformer").state_dict().items())
    image = pipe("a red circle", height=48, width=64, num_inference_steps=2, output_type="np").images
    assert image.shape == (1, 48, 64, 3)


@pytest.mark.parametrize("variant", ["flux-dev", "chroma"])
def test_the_original_transformer_file_is_what_diffusers_converts_and_reads_back(tmp_path, variant):
    """ORIGINAL_TRANSFORMER: Black Forest Labs' layout, which diffusers' single-file converter (at the tiny width)
    turns into our weights; named as the transformer's model over the diffusers base, it is the same transformer."""
    from tests.weights.flux_models import single_file_converter

    family, model = our_model(variant)
    with torch.no_grad():
        for parameter in model.part("transformer").parameters():  # unlike the base's weights
            parameter.add_(0.01 * torch.randn_like(parameter))
    path = tmp_path / "transformer.safetensors"
    family.save(model, ModelFormat.ORIGINAL_TRANSFORMER, path, torch.bfloat16)
    state = load_file(str(path))
    assert "double_blocks.1.img_attn.qkv.weight" in state and "single_blocks.1.linear1.weight" in state
    with safe_open(str(path), "pt") as f:
        assert "modelspec.prediction_type" not in f.metadata()
    assert all(v.dtype is torch.bfloat16 for v in state.values())
    ours = {k: v.to(torch.bfloat16) for k, v in model.part("transformer").state_dict().items()}
    theirs = single_file_converter(dict(model.part("transformer").config))(dict(state))
    assert theirs.keys() == ours.keys() and all(torch.equal(theirs[k], ours[k]) for k in ours)

    _, again = our_model(variant, transformer={"model_name": str(path)})
    assert all(torch.equal(v, ours[k].float()) for k, v in again.part("transformer").state_dict().items())
    assert torch.isfinite(transformer_output(again.part("transformer"))).all()  # built whole: no weight left out
    with pytest.raises(ModelLoadError, match="a single file"):  # the file alone is no base model
        our_model(variant, base_model_name=str(path))


def test_embedding_files_hold_clip_l_and_t5_and_load_in_diffusers_as_ours(tmp_path):
    image_folder(tmp_path, count=2, placeholder="<shape>")
    config = tiny_config(tmp_path, variant="flux-dev", method="EMBEDDING", epochs=1)
    run_config(config)
    path = config["output_model_destination"]
    tensors = load_file(path)
    assert {k: tuple(v.shape) for k, v in tensors.items()} == {"clip_l": (2, 32), "t5": (2, 32)}
    cfg, _ = config_from_dict({**config, "embedding": {**config["embedding"], "model_name": path}})
    family = load_family_class(cfg.model_type)()
    model = family.load(local_config(cfg))
    method = create_method(cfg, family, model, CPU)  # continues from the file
    prompt = "a photo of <shape>"
    with torch.no_grad():
        ours = family.encode_text(model, [method.embeddings.apply(prompt)])
    pipe = diffusers_pipeline("flux-dev")
    tokens = cfg.text_encoder_2_sequence_length  # the T5 length we prompt with (OneTrainer's default, 77)
    with torch.no_grad():
        plain, _, _ = pipe.encode_prompt(prompt, prompt, max_sequence_length=tokens)
    pipe.load_textual_inversion(tensors["clip_l"], token="<shape>", text_encoder=pipe.text_encoder,
                                tokenizer=pipe.tokenizer)  # fmt: skip
    pipe.load_textual_inversion(tensors["t5"], token="<shape>", text_encoder=pipe.text_encoder_2,
                                tokenizer=pipe.tokenizer_2)  # fmt: skip
    with torch.no_grad():
        hidden, pooled, _ = pipe.encode_prompt(prompt, prompt, max_sequence_length=tokens)
    assert tokens == 77 and hidden.shape[1] == tokens
    assert torch.allclose(ours.hidden_states, hidden, atol=1e-5) and torch.allclose(ours.pooled, pooled, atol=1e-5)
    assert not torch.allclose(plain, hidden, atol=1e-3)


@pytest.mark.parametrize("variant", ["flux-dev", "chroma"])
def test_a_fine_tune_backup_is_a_base_model_and_restores_every_part_whole(tmp_path, variant):
    family, model = our_model(variant)
    backup = tmp_path / "backup"
    family.save_backup(model, backup / "model")
    (backup / "meta.json").write_text("{}")
    for part in model.parts:
        model.part(part).load_state_dict(family.backup_state(model, backup / "model", part), strict=True)
    _, again = our_model(variant, base_model_name=str(backup))
    assert torch.equal(transformer_output(again.part("transformer")), transformer_output(model.part("transformer")))
