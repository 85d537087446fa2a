"""Flux.1 Kontext [dev] on its tiny model: a reference's latents and position ids join the image's as
FluxKontextPipeline joins them and the prediction covers the image's tokens only; without a reference it is plain
Flux.1 dev; a second reference is refused by name (a run on such an image stops, saying why); a LoRA trained through
the trainer on images with references (an image without one skipped and named) samples with its reference and loads
in the pipeline's `load_lora_weights` as ours; the same tiny model trains text to image (no references) as Flux.1
dev; a sample with a reference is the pipeline's own; a fine-tune's folder is a FluxKontextPipeline and a base model
again."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

from onetrainer.families.base import BatchInputs
from onetrainer.families.flux import image_ids, pack, reference_ids, reference_size, unpack
from onetrainer.tiny import tiny_model_dir
from onetrainer.training.events import Metrics, SampleReady, Status
from tests.helpers import image_folder, keep_trained_output, loaded_model, run_config, tiny_config

VARIANT = "flux-kontext"
REFERENCE = Image.new("RGB", (48, 64), (200, 30, 30))


def our_model(method: bool = False, **changes):
    data = tiny_config(Path("/nonexistent"), VARIANT, method="LORA", output_model_format="DIFFUSERS_LORA")
    return loaded_model(data, method, **changes)


def pipeline():
    from diffusers import FluxKontextPipeline

    pipe = FluxKontextPipeline.from_pretrained(str(tiny_model_dir(VARIANT)), local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def as_tensor(image: Image.Image) -> torch.Tensor:
    """A picture as the data loader gives a reference: [3, h, w] in [-1, 1]."""
    return torch.from_numpy(np.asarray(image, dtype=np.float32) / 255.0).permute(2, 0, 1).contiguous() * 2.0 - 1.0


def batch(latents: torch.Tensor, references=None) -> BatchInputs:
    return BatchInputs(latents, None, [], [], None, torch.zeros(len(latents), dtype=torch.bool), references=references)


def raw_transformer(pipe, latents, references, ids, conditioning, sigma):
    """The transformer called as FluxKontextPipeline's loop calls it (guidance 1.0: `transformer.guidance_scale`)."""
    hidden = torch.cat([latents, references], dim=1) if references is not None else latents
    with torch.no_grad():
        return pipe.transformer(
            hidden_states=hidden, timestep=sigma, guidance=torch.full([len(latents)], 1.0),
            pooled_projections=conditioning.pooled, encoder_hidden_states=conditioning.hidden_states,
            txt_ids=torch.zeros(conditioning.hidden_states.shape[1], 3), img_ids=ids, return_dict=False,
        )[0]  # fmt: skip


def test_the_reference_joins_the_image_as_the_pipeline_joins_it():
    family, model = our_model()
    pipe = pipeline()
    latents = torch.randn(1, 16, 8, 8, generator=torch.Generator().manual_seed(0))
    sigma = torch.tensor([0.4])
    with torch.no_grad():
        conditioning = family.encode_text(model, ["make it green"])
        extra = family.batch_extras(model, batch(latents, [[as_tensor(REFERENCE)]]))
        predicted = family.predict(model, latents, sigma * 1000, conditioning, extra).output
        # as the pipeline prepares the reference (`_auto_resize=False`): its size in steps of 16 px, the VAE's mode,
        # shifted and scaled, packed; its ids the image's kind with the first set to 1, after the image's
        pixels = pipe.image_processor.preprocess(REFERENCE, 64, 48)
        theirs = pipe._encode_vae_image(pixels, generator=None)
        # (a CPU convolution differs in the last digits from one call to the next)
        assert torch.allclose(extra["reference_latents"], theirs, atol=1e-3)
        packed = pipe._pack_latents(theirs, 1, 16, 8, 6)
        ids = pipe._prepare_latent_image_ids(1, 4, 3, "cpu", torch.float32)
        ids[..., 0] = 1
        assert torch.equal(reference_ids(theirs), ids)
        joined = torch.cat([pipe._prepare_latent_image_ids(1, 4, 4, "cpu", torch.float32), ids])
        raw = raw_transformer(pipe, pack(latents), packed, joined, conditioning, sigma)
    assert raw.shape[1] == 16 + 12
    assert torch.allclose(predicted, unpack(raw[:, :16], 8, 8), atol=1e-5)


def test_without_a_reference_it_is_flux_dev():
    family, model = our_model()
    pipe = pipeline()
    latents = torch.randn(2, 16, 8, 8, generator=torch.Generator().manual_seed(1))
    sigma = torch.tensor([0.3, 0.8])
    with torch.no_grad():
        conditioning = family.encode_text(model, ["a red circle", "two squares"])
        for references in (None, [[], []]):
            extra = family.batch_extras(model, batch(latents, references))
            assert set(extra) == {"guidance"}
            predicted = family.predict(model, latents, sigma * 1000, conditioning, extra).output
            raw = raw_transformer(pipe, pack(latents), None, image_ids(4, 4, "cpu"), conditioning, sigma)
            assert torch.allclose(predicted, unpack(raw, 8, 8), atol=1e-5)


def test_a_second_reference_is_refused_by_name(tmp_path):
    from onetrainer.config.sample_config import SampleConfig

    family, model = our_model()
    with pytest.raises(ValueError, match=r"one reference image per training image, not 2: keep `<name>-reference"):
        family.encode_references(model, [as_tensor(REFERENCE), as_tensor(REFERENCE)])
    paths = [tmp_path / "a.png", tmp_path / "b.png"]
    for path in paths:
        REFERENCE.save(path)
    sample = SampleConfig(prompt="x", width=32, height=32, reference_images=[str(p) for p in paths])
    with pytest.raises(ValueError, match="one reference image per sample, not 2"):
        family.pipeline_arguments(model, sample, False)


def test_a_reference_is_used_at_its_own_size_in_steps_of_16_and_at_most_1024_squared():
    assert reference_size(48, 64) == (48, 64)
    assert reference_size(72, 50) == (64, 48)
    assert reference_size(2048, 1024) == (1440, 720)


def test_a_sample_with_a_reference_is_the_pipelines_own(tmp_path):
    from onetrainer.config.sample_config import SampleConfig

    path = tmp_path / "reference.png"
    REFERENCE.save(path)
    sample = SampleConfig(prompt="make it green", width=64, height=48, seed=3, diffusion_steps=2, cfg_scale=3.5,
                          reference_images=[str(path)])  # fmt: skip
    family, model = our_model()
    ours = np.asarray(family.sample(model, sample, lambda t: t, False), dtype=np.int16)
    pipe = family.pipeline(model, model.schedule.sampler(sample.noise_scheduler, False))
    pipe.set_progress_bar_config(disable=True)
    theirs = pipe(prompt="make it green", image=REFERENCE, width=64, height=48, num_inference_steps=2,
                  guidance_scale=3.5, max_sequence_length=77, _auto_resize=False, max_area=64 * 48, output_type="np",
                  generator=torch.Generator().manual_seed(3)).images[0]  # fmt: skip
    assert ours.shape == (48, 64, 3) and np.abs(ours - (theirs * 255).round()).max() <= 1
    sample.reference_images = []
    plain = np.asarray(family.sample(model, sample, lambda t: t, False), dtype=np.int16)
    assert plain.shape == ours.shape and np.abs(plain - ours).max() > 1  # the reference changes the sample


def _kontext_folder(root: Path) -> Path:
    """Three images: two with a reference (at one size, so a batch stacks them), one without (trained text to image)."""
    folder = image_folder(root, count=3)
    first, second, _ = sorted(p for p in folder.glob("*.png") if "-masklabel" not in p.name)
    for image in (first, second):
        Image.open(image).convert("RGB").transpose(Image.Transpose.FLIP_LEFT_RIGHT).resize((48, 64)).save(
            folder / f"{image.stem}-reference.png"
        )
    return folder


def test_a_kontext_lora_trains_on_references_samples_with_them_and_loads_in_the_pipeline(tmp_path):
    from onetrainer.tiny.denoiser_step import denoiser_inputs

    folder = _kontext_folder(tmp_path)
    reference = next(folder.glob("*-reference.png"))
    config = tiny_config(
        tmp_path, VARIANT, "LORA", epochs=1, batch_size=1, learning_rate=1e-2, output_model_format="DIFFUSERS_LORA",
        output_model_destination=str(tmp_path / "out" / "kontext.safetensors"),
        samples=[{"prompt": "make it green", "width": 64, "height": 48, "seed": 1, "diffusion_steps": 2,
                  "reference_images": [str(reference)]}],
        sample_after=1, sample_after_unit="EPOCH",
    )  # fmt: skip
    events = run_config(config)
    assert len([e for e in events if isinstance(e, Metrics)]) == 3  # the image without a reference trains too
    (line,) = [e.text for e in events if isinstance(e, Status) and "no reference image" in e.text]
    assert "1 images have no reference image and train Flux.1 Kontext Dev as text to image" in line
    (ready,) = [e for e in events if isinstance(e, SampleReady)]
    assert Image.open(ready.path).size == (64, 48)

    path = config["output_model_destination"]
    _, ours = our_model(method=True, lora_model_name=path)
    pipe = pipeline()

    def output(transformer):
        with torch.no_grad():
            return transformer(**denoiser_inputs(transformer)).sample

    before = output(pipe.transformer)
    pipe.load_lora_weights(path)
    theirs = output(pipe.transformer)
    assert not torch.allclose(before, theirs, atol=1e-4)
    assert torch.allclose(output(ours.part("transformer")), theirs, atol=1e-5)


def test_the_kontext_model_trains_text_to_image_without_references(tmp_path):
    """Plain text-to-image training of the Kontext model: its transformer is Flux.1 dev's, trained as FLUX_DEV_1 on
    images without references."""
    image_folder(tmp_path, count=2)
    config = tiny_config(tmp_path, VARIANT, "LORA", epochs=1, model_type="FLUX_DEV_1",
                         output_model_format="DIFFUSERS_LORA")  # fmt: skip
    assert len([e for e in run_config(config) if isinstance(e, Metrics)]) == 1
    assert Path(config["output_model_destination"]).is_file()


def test_an_image_with_two_references_is_named_and_skipped_and_the_rest_trains(tmp_path):
    from onetrainer.config import config_from_dict
    from onetrainer.training.control import TrainingControl
    from onetrainer.training.events import Finished, ListSink, Warning_
    from onetrainer.training.runner import run_training

    folder = image_folder(tmp_path, count=2)
    first, _ = sorted(p for p in folder.glob("*.png") if "-masklabel" not in p.name)
    for n in (1, 2):
        REFERENCE.save(folder / f"{first.stem}-reference-{n}.png")
    config, problems = config_from_dict(tiny_config(tmp_path, VARIANT, "LORA", epochs=1, batch_size=1))
    assert [p for p in problems if p.is_error] == []
    sink = ListSink()
    outcome = run_training(config, TrainingControl(), [sink])
    assert isinstance(outcome, Finished)
    assert len([e for e in sink.events if isinstance(e, Metrics)]) == 1  # the other image, text to image
    lines = " ".join(e.text for e in sink.events if isinstance(e, Warning_))
    assert "more reference images than FLUX_KONTEXT_DEV_1 takes" in lines and f"{first.name} (2)" in lines


def test_a_fine_tune_folder_is_a_kontext_pipeline_and_a_base_model_again(tmp_path):
    from diffusers import FluxKontextPipeline

    _kontext_folder(tmp_path)
    config = tiny_config(
        tmp_path, VARIANT, "FINE_TUNE", epochs=1, batch_size=1, learning_rate=1e-3, output_model_format="DIFFUSERS",
        output_model_destination=str(tmp_path / "out" / "model"), output_dtype="FLOAT_32",
        text_encoder={"train": False}, text_encoder_2={"train": False},
    )  # fmt: skip
    assert len([e for e in run_config(config) if isinstance(e, Metrics)]) == 3  # two edits, one text to image
    out = tmp_path / "out" / "model"
    trained = FluxKontextPipeline.from_pretrained(str(out), local_files_only=True)
    base = pipeline()
    assert not all(torch.equal(a, b) for a, b in zip(trained.transformer.parameters(), base.transformer.parameters()))
    _, again = our_model(base_model_name=str(out))
    assert all(
        torch.equal(a, b) for a, b in zip(again.part("transformer").parameters(), trained.transformer.parameters())
    )


def test_a_kontext_sample_takes_one_reference_or_none_named_at_config_time(tmp_path):
    from onetrainer.config import config_from_dict

    reference = tmp_path / "ref.png"
    REFERENCE.save(reference)
    samples = [
        {"prompt": "a cat", "width": 64, "height": 64},
        {"prompt": "make it green", "width": 64, "height": 64, "reference_images": [str(reference)]},
        {"prompt": "two", "width": 64, "height": 64, "reference_images": [str(reference), str(reference)]},
    ]
    _, problems = config_from_dict(tiny_config(tmp_path, VARIANT, "LORA", samples=samples))
    errors = {p.path: p.message for p in problems if p.is_error}
    assert list(errors) == ["samples.2.reference_images"]
    assert "takes one reference image per sample, not 2" in errors["samples.2.reference_images"]


def test_an_embedding_learns_from_edits_and_samples_with_a_reference(tmp_path):
    """Kontext's embeddings are Flux.1's (CLIP-L and T5 vectors, `clip_l` / `t5`), learnt on edit pairs; the sample
    renders from its reference with the placeholder in the prompt."""
    folder = _kontext_folder(tmp_path)
    for caption in folder.glob("*.txt"):
        caption.write_text("<shape>, " + caption.read_text(encoding="utf-8"), encoding="utf-8")
    reference = next(folder.glob("*-reference.png"))
    config = tiny_config(
        tmp_path, VARIANT, "EMBEDDING", epochs=1, batch_size=1,
        samples=[{"prompt": "make <shape> green", "width": 64, "height": 48, "seed": 1, "diffusion_steps": 2,
                  "reference_images": [str(reference)]}],
        sample_after=1, sample_after_unit="EPOCH",
    )  # fmt: skip
    events = run_config(config)
    assert len([e for e in events if isinstance(e, Metrics)]) == 3
    assert len([e for e in events if isinstance(e, SampleReady)]) == 1
    assert set(load_file(config["output_model_destination"])) == {"clip_l", "t5"}


@pytest.mark.parametrize("kind", ["loha", "lokr"])
def test_lycoris_kinds_learn_edits_and_read_back_as_trained(tmp_path, monkeypatch, kind):
    """LoHa and LoKr on Kontext's edit pairs, as KOHYA_LORA in Flux.1's layout: read back into a fresh model they
    give the trained transformer's output."""
    from onetrainer.tiny.denoiser_step import denoiser_inputs

    def output(transformer):
        with torch.no_grad():
            return transformer(**denoiser_inputs(transformer)).sample

    settings = {"loha": {"peft_type": "LOHA"}, "lokr": {"peft_type": "LOKR", "lokr_dim": 2}}[kind]
    _kontext_folder(tmp_path)
    trained = keep_trained_output(monkeypatch, output)
    config = tiny_config(
        tmp_path, VARIANT, "LORA", epochs=1, batch_size=1, learning_rate=1e-2, output_model_format="KOHYA_LORA",
        layer_filter_preset="attn-mlp", text_encoder={"train": False}, text_encoder_2={"train": False}, **settings,
    )  # fmt: skip
    run_config(config)
    path = config["output_model_destination"]
    marker = "hada_w1_a" if kind == "loha" else "lokr_w1"
    assert f"lora_transformer_transformer_blocks_0_attn_to_q.{marker}" in load_file(path)
    _, again = our_model(method=True, lora_model_name=path, output_model_format="KOHYA_LORA", **settings)
    _, plain = our_model()
    ours = output(again.part("transformer"))
    assert torch.allclose(ours, trained["output"], atol=1e-5)
    assert not torch.allclose(ours, output(plain.part("transformer")), atol=1e-4)  # it trained
