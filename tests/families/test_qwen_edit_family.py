"""Qwen-Image-Edit on its tiny model: an instruction with its reference images is encoded as
QwenImageEditPlusPipeline encodes it, the references' latents join the transformer's sequence as the pipeline joins
them and the prediction covers the noisy image's tokens only; an edit LoRA trained through the trainer on images with
references of several sizes (an image without one skipped and named) samples with reference images and loads in the
edit pipeline as ours.

The references are made small here (about 64² px for the VL encoder, 128² for the VAE, where the real models take 384²
and 1024²): the video VAE's 3D convolutions are slow on a CPU at 1024²."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

from onetrainer.families import qwen
from onetrainer.families.latent_patches import pack, unpack
from onetrainer.families.qwen_processor import load_processor
from onetrainer.tiny import tiny_model_dir
from onetrainer.training.events import Metrics, SampleReady
from tests.helpers import image_folder, loaded_model, run_config, small_edit_references, tiny_config

VAE_AREA = 128 * 128  # `small_edit_references`


@pytest.fixture(autouse=True)
def small_references(monkeypatch):
    small_edit_references(monkeypatch)


def our_model(method: bool = False, **changes):
    data = tiny_config(Path("/nonexistent"), "qwen-image-edit", method="LORA", output_model_format="COMFY_LORA")
    return loaded_model(data, method, **changes)


def pipeline():
    from diffusers import QwenImageEditPlusPipeline

    folder = tiny_model_dir("qwen-image-edit")
    pipe = QwenImageEditPlusPipeline.from_pretrained(str(folder), processor=load_processor(folder),
                                                     local_files_only=True)  # fmt: skip
    pipe.set_progress_bar_config(disable=True)
    return pipe


REFERENCES = [Image.new("RGB", (48, 64), (200, 30, 30)), Image.new("RGB", (64, 32), (30, 30, 200))]


def test_the_instruction_and_the_references_are_the_pipelines():
    from onetrainer.families.base import BatchInputs

    family, model = our_model()
    pipe = pipeline()
    with torch.no_grad():
        ours = family.encode_text(model, ["make it green"], references=[REFERENCES])
        hidden, mask = qwen.used_tokens(ours)
        theirs, their_mask = pipe.encode_prompt("make it green", image=[qwen.condition_image(r) for r in REFERENCES])
        assert their_mask is None and mask is None and torch.allclose(hidden, theirs, atol=1e-5)

        latents = torch.randn(1, 16, 8, 8)
        inputs = BatchInputs(latents, None, [], [], None, torch.zeros(1, dtype=torch.bool), references=[REFERENCES])
        extra = family.batch_extras(model, inputs)
        expected, shapes = [], []
        for image in REFERENCES:  # as the pipeline prepares each reference's latents
            width, height = qwen.calculate_dimensions(VAE_AREA, image.width / image.height)
            pixels = pipe.image_processor.preprocess(image, height, width).unsqueeze(2)
            z = pipe._encode_vae_image(pixels, generator=None)
            expected.append(pipe._pack_latents(z, 1, 16, z.shape[3], z.shape[4]))
            shapes.append((1, z.shape[3] // 2, z.shape[4] // 2))
        assert extra["reference_shapes"] == shapes
        assert torch.allclose(extra["reference_tokens"], torch.cat(expected, dim=1), atol=1e-5)

        sigma = torch.tensor([0.4])
        predicted = family.predict(model, latents, sigma * 1000, ours, extra).output
        raw = pipe.transformer(hidden_states=torch.cat([pack(latents), *expected], dim=1), encoder_hidden_states=theirs,
                               timestep=sigma, img_shapes=[[(1, 4, 4), *shapes]], return_dict=False)[0]  # fmt: skip
        assert torch.allclose(predicted, unpack(raw[:, :16], 8, 8), atol=1e-5)


def _edit_folder(root: Path, placeholder: str | None = None) -> Path:
    """Three images: one with a reference, one with two of other sizes, one without (skipped)."""
    folder = image_folder(root, count=3, placeholder=placeholder)
    first, second, third = sorted(p for p in folder.glob("*.png") if "-masklabel" not in p.name)
    Image.open(first).convert("RGB").resize((40, 56)).save(folder / f"{first.stem}-reference.png")
    Image.open(second).convert("RGB").resize((64, 32)).save(folder / f"{second.stem}-reference-1.png")
    Image.open(third).convert("RGB").resize((32, 48)).save(folder / f"{second.stem}-reference-2.png")
    return folder


def test_an_edit_lora_trains_on_references_samples_with_them_and_loads_in_the_edit_pipeline(tmp_path):
    folder = _edit_folder(tmp_path)
    reference = next(folder.glob("*-reference.png"))
    config = tiny_config(
        tmp_path, "qwen-image-edit", "LORA", epochs=1, batch_size=1, learning_rate=1e-2,
        output_model_format="COMFY_LORA", layer_filter_preset="attn-mlp", text_encoder={"train": False},
        output_model_destination=str(tmp_path / "out" / "edit.safetensors"),
        samples=[{"prompt": "make it green", "width": 64, "height": 48, "seed": 1, "diffusion_steps": 2,
                  "cfg_scale": 4.0, "negative_prompt": "blue", "reference_images": [str(reference)]}],
        sample_after=1, sample_after_unit="EPOCH",
    )  # fmt: skip
    events = run_config(config)
    assert len([e for e in events if isinstance(e, Metrics)]) == 2  # the image without a reference is skipped
    (ready,) = [e for e in events if isinstance(e, SampleReady)]
    assert Image.open(ready.path).size == (64, 48)
    path = Path(config["output_model_destination"])
    assert "diffusion_model.transformer_blocks.0.attn.to_q.lora_down.weight" in load_file(str(path))

    _, ours = our_model(method=True, lora_model_name=str(path))
    pipe = pipeline()
    generator = torch.Generator().manual_seed(0)
    latents, text = torch.randn(1, 16, 8, 8, generator=generator), torch.randn(1, 5, 32, generator=generator)

    def output(transformer):
        with torch.no_grad():
            return transformer(hidden_states=pack(latents), encoder_hidden_states=text, timestep=torch.tensor([0.5]),
                               img_shapes=[[(1, 4, 4)]], return_dict=False)[0]  # fmt: skip

    before = output(pipe.transformer)
    pipe.load_lora_weights(str(path))
    theirs = output(pipe.transformer)
    assert not torch.allclose(before, theirs, atol=1e-4)
    assert torch.allclose(output(ours.part("transformer")), theirs, atol=1e-5)


def test_a_sample_of_an_edit_model_without_reference_images_says_what_it_needs():
    from onetrainer.config.sample_config import SampleConfig

    family, model = our_model()
    with pytest.raises(ValueError, match="needs reference images"):
        family.sample(model, SampleConfig(prompt="x", width=32, height=32, diffusion_steps=1), lambda t: t, False)


def test_an_edit_sample_is_the_pipelines_own_and_follows_the_text_encoders_clip_skip(tmp_path):
    """Our sample encodes the instruction and the negative prompt with the reference images itself: at clip skip 0 it
    is the image the edit pipeline makes from the texts; a clip skip set for the text encoder changes it, as in
    training."""
    import numpy as np

    from onetrainer.config.sample_config import SampleConfig

    path = tmp_path / "reference.png"
    REFERENCES[0].save(path)
    sample = SampleConfig(prompt="make it green", negative_prompt="blue", width=64, height=48, seed=3,
                          diffusion_steps=2, cfg_scale=4.0, reference_images=[str(path)])  # fmt: skip
    family, model = our_model()
    ours = np.asarray(family.sample(model, sample, lambda t: t, False), dtype=np.int16)
    pipe = family.pipeline(model, model.schedule.sampler(sample.noise_scheduler, False))
    pipe.set_progress_bar_config(disable=True)
    theirs = pipe(prompt="make it green", negative_prompt="blue", image=[REFERENCES[0]], width=64, height=48,
                  num_inference_steps=2, guidance_scale=None, true_cfg_scale=4.0, output_type="np",
                  generator=torch.Generator().manual_seed(3)).images[0]  # fmt: skip
    assert np.abs(ours - (theirs * 255).round()).max() <= 1

    family, skipping = our_model(text_encoder={"layer_skip": 1})
    with torch.no_grad():
        given = family.sample_prompt_arguments(skipping, "make it green", "blue", {"image": [REFERENCES[0]]})
        unskipped = family.sample_prompt_arguments(model, "make it green", "blue", {"image": [REFERENCES[0]]})
        skipped, _ = qwen.used_tokens(family.encode_text(skipping, ["make it green"], references=[[REFERENCES[0]]]))
    assert torch.equal(given["prompt_embeds"], skipped)
    assert not torch.allclose(given["prompt_embeds"], unskipped["prompt_embeds"], atol=1e-3)


def test_an_edit_fine_tune_trains_on_references_and_its_folder_is_an_edit_pipeline(tmp_path):
    from diffusers import QwenImageEditPlusPipeline

    _edit_folder(tmp_path)
    config = tiny_config(
        tmp_path, "qwen-image-edit", "FINE_TUNE", epochs=1, batch_size=1, learning_rate=1e-3,
        output_model_format="DIFFUSERS", output_model_destination=str(tmp_path / "out" / "model"),
        output_dtype="FLOAT_32", text_encoder={"train": False},
    )  # fmt: skip
    assert len([e for e in run_config(config) if isinstance(e, Metrics)]) == 2
    out = tmp_path / "out" / "model"
    trained = QwenImageEditPlusPipeline.from_pretrained(
        str(out), processor=load_processor(tiny_model_dir("qwen-image-edit")), local_files_only=True
    )
    base = pipeline()
    assert not all(
        torch.equal(a, b) for a, b in zip(trained.transformer.parameters(), base.transformer.parameters())
    )  # it trained
    _, again = our_model(base_model_name=str(out))  # and the folder is an edit base model again
    assert all(
        torch.equal(a, b) for a, b in zip(again.part("transformer").parameters(), trained.transformer.parameters())
    )


def test_references_are_cached_with_their_image_and_the_cached_run_trains_as_the_uncached_one(tmp_path):
    """The references' latents (with the image's) and the instruction's encoding with its references (per caption)
    come from the content-keyed cache: a second run encodes nothing, changing one reference re-encodes its image
    only, and the losses are the ones of a run that encodes everything each step."""
    from onetrainer.training.events import CacheFilled

    folder = _edit_folder(tmp_path)
    config = tiny_config(
        tmp_path, "qwen-image-edit", "LORA", epochs=2, batch_size=1, learning_rate=1e-2,
        output_model_format="COMFY_LORA", text_encoder={"train": False},
        output_model_destination=str(tmp_path / "out" / "edit.safetensors"),
    )  # fmt: skip

    def run(**changes):
        events = run_config({**config, **changes})
        filled = {e.kind: (e.needed, e.encoded) for e in events if isinstance(e, CacheFilled)}
        return filled, [e.loss for e in events if isinstance(e, Metrics)]

    first, cached_losses = run()
    assert first == {"latents": (2, 2), "captions": (2, 2)}
    assert len(cached_losses) == 4
    again, _ = run()
    assert again == {"latents": (2, 0), "captions": (2, 0)}

    _, uncached_losses = run(latent_caching=False)
    assert torch.allclose(torch.tensor(cached_losses), torch.tensor(uncached_losses), atol=1e-5)
    # a trained text encoder reads the references (decoded from their files) with the caption each step
    trained_encoder, losses = run(text_encoder={"train": True})
    assert trained_encoder == {"latents": (2, 0)} and len(losses) == 4 and all(math.isfinite(x) for x in losses)

    changed = next(folder.glob("*-reference-1.png"))
    Image.new("RGB", (64, 32), (10, 200, 10)).save(changed)
    after, _ = run()
    assert after == {"latents": (2, 1), "captions": (2, 1)}


def test_an_edit_embedding_learns_beside_the_references_and_prompts_the_edit_pipeline_as_ours(tmp_path):
    """Qwen-Image's embedding file, trained on images with references (read with the caption each step); the edit
    pipeline given the tokens and vectors encodes an instruction with its pictures as ours does."""
    from onetrainer.config import config_from_dict
    from onetrainer.methods import create_method

    _edit_folder(tmp_path, placeholder="<shape>")
    config = tiny_config(tmp_path, "qwen-image-edit", "EMBEDDING", epochs=1, batch_size=1, learning_rate=1e-2)
    assert len([e for e in run_config(config) if isinstance(e, Metrics)]) == 2
    path = config["output_model_destination"]
    vectors = load_file(path)["qwen25_7b"]
    cfg, _ = config_from_dict({**config, "embedding": {**config["embedding"], "model_name": path}})
    family, model = our_model()
    method = create_method(cfg, family, model, torch.device("cpu"))
    pipe = pipeline()
    tokens = ["<shape>", "<shape>_1"]
    pipe.processor.tokenizer.add_tokens(tokens)
    pipe.text_encoder.resize_token_embeddings(len(pipe.processor.tokenizer))
    with torch.no_grad():
        table = pipe.text_encoder.get_input_embeddings().weight
        for token, vector in zip(tokens, vectors):
            table[pipe.processor.tokenizer.convert_tokens_to_ids(token)] = vector
        instruction = method.embeddings.apply("make <shape> green")
        ours, _ = qwen.used_tokens(family.encode_text(model, [instruction], references=[REFERENCES]))
        pictures = [qwen.condition_image(r) for r in REFERENCES]
        theirs, _ = pipe.encode_prompt("make <shape> <shape>_1 green", image=pictures)
    assert ours.shape == theirs.shape and torch.allclose(ours, theirs, atol=1e-5)
