"""Flux.2 edits on the tiny [klein] model: reference images as the pipeline feeds them (their tokens and position ids,
the prediction over image and references), a LoRA trained on images with one or two references and on images without
any (text to image) from one concept, an image with more than the model takes named and skipped, and samples with
several references."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from PIL import Image, ImageOps

from onetrainer.families.flux2 import image_ids, reference_ids, reference_size
from onetrainer.tools.masks import image_tensor
from onetrainer.training.events import Finished, ListSink, Metrics, SampleReady, Status, Warning_
from tests.families.test_flux2_family import DEV, VARIANT, VARIANTS, our_model, pipeline
from tests.helpers import image_folder, tiny_config


def _picture(size: tuple[int, int], seed: int) -> Image.Image:
    generator = torch.Generator().manual_seed(seed)
    pixels = (torch.rand(size[1], size[0], 3, generator=generator) * 255).to(torch.uint8).numpy()
    return Image.fromarray(pixels)


@pytest.mark.parametrize("variant", VARIANTS)
def test_references_are_the_pipelines_tokens_ids_and_prediction(variant):
    family, model = our_model(variant=variant)
    pipe = pipeline(variant=variant)
    # 80x72 is cropped to 80x64 (16 px steps); 64x64 is used as it is
    pictures = [_picture((80, 72), 1), _picture((64, 64), 2)]
    assert reference_size(80, 72) == (80, 64) and reference_size(2048, 1024) == (1440, 720)
    with torch.no_grad():
        ours = family.encode_references(model, [image_tensor(p) * 2 - 1 for p in pictures])
        processed = [pipe.image_processor.preprocess(p, height=64, width=w, resize_mode="crop")
                     for p, w in zip(pictures, (80, 64))]  # fmt: skip
        tokens, ids = pipe.prepare_image_latents(processed, 1, None, torch.device("cpu"), torch.float32)
    assert torch.allclose(ours["reference_tokens"], tokens[0], atol=1e-5)  # [-1, 1] by another rounding
    assert torch.equal(ours["reference_ids"], ids[0])
    assert ours["reference_ids"][:, 0].unique().tolist() == [10, 20]  # reference i at time 10 + 10·i

    # the prediction covers the image's tokens, the references' joined after them as the pipeline joins them
    text = family.encode_text(model, ["make it blue"])
    noisy, sigma = torch.randn(1, 32, 8, 6), torch.tensor([0.5])
    extra = {"reference_tokens": ours["reference_tokens"][None], "reference_ids": ours["reference_ids"][None]}
    guidance = torch.tensor([4.0]) if variant == DEV else None  # [dev]'s guidance input; [klein] has none
    with torch.no_grad():
        if guidance is not None:
            extra["guidance"] = guidance
        predicted = family.predict(model, noisy, sigma * 1000, text, extra).output
        patches = pipe._patchify_latents(noisy)
        raw = pipe.transformer(
            hidden_states=torch.cat([pipe._pack_latents(patches), tokens], dim=1), timestep=sigma, guidance=guidance,
            encoder_hidden_states=text.hidden_states, txt_ids=pipe._prepare_text_ids(text.hidden_states),
            img_ids=torch.cat([pipe._prepare_latent_ids(patches), ids], dim=1), return_dict=False,
        )[0][:, : 4 * 3]  # fmt: skip
        theirs = pipe._unpatchify_latents(raw.transpose(1, 2).reshape(1, 128, 4, 3))
        plain = family.predict(
            model, noisy, sigma * 1000, text, {"guidance": guidance} if variant == DEV else {}
        ).output
    assert torch.allclose(predicted, theirs, atol=1e-5)
    assert not torch.allclose(predicted, plain, atol=1e-4)  # the references change the prediction
    assert torch.equal(reference_ids(1, 2, 2, "cpu")[:, 1:], image_ids(2, 2, "cpu")[:, 1:])


@pytest.mark.parametrize("variant", VARIANTS)
def test_an_edit_lora_trains_with_and_without_references_and_samples_with_two(tmp_path, variant):
    """One concept: an image with two references, one with one, one with none (text to image), and one with eleven,
    named and skipped (the model takes ten). Batch size 1; samples pass both references to the pipeline. One caption
    for all: the text encoder does not read the references, so it is encoded once (and the empty caption), not once
    per image's references."""
    from onetrainer.config import config_from_dict
    from onetrainer.training.control import TrainingControl
    from onetrainer.training.runner import run_training

    folder = image_folder(tmp_path, count=4)
    two, one, _, many = sorted(p for p in folder.glob("*.png") if "-masklabel" not in p.name)
    mirrored = ImageOps.mirror(Image.open(two).convert("RGB")).resize((64, 80))
    for n in (1, 2):
        mirrored.save(folder / f"{two.stem}-reference-{n}.png")
    mirrored.save(folder / f"{one.stem}-reference.png")
    for caption in folder.glob("*.txt"):
        caption.write_text("mirror it", encoding="utf-8")
    for n in range(1, 12):
        mirrored.save(folder / f"{many.stem}-reference-{n}.png")
    references = [str(folder / f"{two.stem}-reference-{n}.png") for n in (1, 2)]
    data = tiny_config(
        tmp_path, variant, "LORA", epochs=1, batch_size=1, learning_rate=1e-2,
        output_model_destination=str(tmp_path / "out" / "edit.safetensors"),
        samples=[{"prompt": "mirror it", "width": 64, "height": 48, "seed": 1, "diffusion_steps": 2,
                  "cfg_scale": 4.0, "reference_images": references}],
        sample_after=1, sample_after_unit="EPOCH", text_encoder={"train": False},  # captions from the text cache
    )  # fmt: skip
    config, problems = config_from_dict(data)
    assert [p for p in problems if p.is_error] == []
    sink = ListSink()
    assert isinstance(run_training(config, TrainingControl(), [sink]), Finished)
    assert len([e for e in sink.events if isinstance(e, Metrics)]) == 3
    assert "captions: 0 cached, 2 encoded" in [e.text for e in sink.events if isinstance(e, Status)]
    warnings = " ".join(e.text for e in sink.events if isinstance(e, Warning_))
    assert f"more reference images than FLUX_2 takes and are skipped: {many.name} (11)" in warnings
    (ready,) = [e for e in sink.events if isinstance(e, SampleReady)]
    assert Image.open(ready.path).size == (64, 48)
    assert Path(data["output_model_destination"]).is_file()


def test_a_sample_with_more_references_than_flux2_takes_is_named_at_config_time(tmp_path):
    from onetrainer.config import config_from_dict

    reference = tmp_path / "ref.png"
    _picture((64, 64), 3).save(reference)
    samples = [
        {"prompt": "a cat", "width": 64, "height": 64},
        {"prompt": "eleven", "width": 64, "height": 64, "reference_images": [str(reference)] * 11},
    ]
    _, problems = config_from_dict(tiny_config(tmp_path, VARIANT, "LORA", samples=samples))
    errors = {p.path: p.message for p in problems if p.is_error}
    assert list(errors) == ["samples.1.reference_images"]
    assert "takes at most 10 per sample, not 11" in errors["samples.1.reference_images"]
