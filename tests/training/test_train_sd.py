"""End to end on tiny SD 1.5 and SD 2.1 (v-prediction) models: train through the CLI's `main(argv)`, then load what
was written with diffusers' own loaders and check it gives the same latents as our code."""

from __future__ import annotations

import math

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from onetrainer.cli.train import main
from onetrainer.config import config_from_dict
from onetrainer.families.sd import StableDiffusionFamily
from onetrainer.methods import create_method
from onetrainer.tiny import tiny_model_dir
from tests.helpers import image_folder, image_tags, local_config, read_scalars, tiny_config, write_config

CPU = torch.device("cpu")


def train(root, **overrides) -> dict:
    image_folder(root, placeholder=overrides.pop("placeholder", None))
    config = tiny_config(root, **overrides)
    assert main(["--config-path", str(write_config(root, config))]) == 0
    return config


def our_model(config: dict, **changes):
    """Our model with a written result applied, the way our own code loads it (continue / base-model paths)."""
    data = {**config, **changes}
    cfg, problems = config_from_dict(data)
    assert [p for p in problems if p.is_error] == []
    family = StableDiffusionFamily()
    model = family.load(local_config(cfg))
    method = create_method(cfg, family, model, CPU)
    return family, model, method


def latents(pipe, prompt: str, steps: int = 2) -> torch.Tensor:
    from diffusers import DDIMScheduler

    pipe.scheduler = DDIMScheduler.from_config(pipe.scheduler.config)
    pipe.set_progress_bar_config(disable=True)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        return pipe(
            prompt, height=64, width=64, num_inference_steps=steps, guidance_scale=3.0, generator=generator,
            output_type="latent",
        ).images  # fmt: skip


def diffusers_pipeline(variant: str):
    from diffusers import StableDiffusionPipeline

    return StableDiffusionPipeline.from_pretrained(str(tiny_model_dir(variant)), safety_checker=None)


def ours_pipeline(family, model):
    from diffusers import DDIMScheduler

    for module in model.parts.values():
        module.eval()
    return family.pipeline(model, DDIMScheduler.from_config(model.schedule.scheduler_config))


def assert_loss_trained(root, steps: int):
    scalars = read_scalars(root / "workspace" / "tensorboard")
    losses = [v for _, v in scalars["loss/train_step"]]
    assert [s for s, _ in scalars["loss/train_step"]] == list(range(1, steps + 1))  # one point per step, x = step
    assert all(math.isfinite(v) for v in losses)
    assert len(set(losses)) > 1  # the loss moves
    assert "smooth_loss/train_step" in scalars
    return scalars


@pytest.mark.parametrize("variant", ["sd15", "sd21"])
def test_lora_trains_and_loads_in_diffusers(tmp_path, variant):
    config = train(
        tmp_path,
        variant=variant,
        method="LORA",
        text_encoder={"train": False},
        sample_after=1,
        sample_after_unit="EPOCH",
        samples=[{"prompt": "a red circle", "width": 64, "height": 64, "diffusion_steps": 2, "seed": 3}],
    )
    scalars = assert_loss_trained(tmp_path, steps=4)
    assert "lr/unet_lora" in scalars and scalars["lr/unet_lora"][-1][1] == pytest.approx(1e-3)
    assert any(tag.startswith("sample/0 - a red circle") for tag in image_tags(tmp_path / "workspace" / "tensorboard"))
    assert len(list((tmp_path / "workspace" / "samples").rglob("*.jpg"))) == 2  # after each epoch
    assert list((tmp_path / "workspace" / "logs").glob("*.log"))

    path = tmp_path / "out" / "lora.safetensors"
    weights = load_file(str(path))
    assert "lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn1_to_q.lora_down.weight" in weights
    assert weights["lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn1_to_q.alpha"].item() == 2.0
    assert not any(k.startswith("lora_te") for k in weights)  # the text encoder did not train
    with safe_open(str(path), "pt") as f:
        meta = f.metadata()
    expected = {
        "sd15": ("sd_v1", "stable-diffusion-v1/lora", "epsilon"),
        "sd21": ("sd_v2_v", "stable-diffusion-v2-768-v/lora", "v"),
    }
    version, architecture, prediction = expected[variant]
    assert meta["ss_base_model_version"] == version and meta["modelspec.architecture"] == architecture
    assert meta["modelspec.prediction_type"] == prediction
    assert meta["ss_network_dim"] == "4" and meta["ss_network_alpha"] == "2"
    assert (meta.get("ss_v2") == "True") == (variant == "sd21")

    family, model, _ = our_model(config, lora_model_name=str(path))
    ours = latents(ours_pipeline(family, model), "a red circle")
    pipe = diffusers_pipeline(variant)
    base = latents(pipe, "a red circle")
    pipe.load_lora_weights(str(path))
    theirs = latents(pipe, "a red circle")
    assert torch.allclose(ours, theirs, atol=1e-4)
    assert not torch.allclose(base, theirs, atol=1e-4)  # the LoRA changes the result


def test_lora_with_text_encoder_in_diffusers_format(tmp_path):
    config = train(tmp_path, method="LORA", text_encoder={"train": True}, output_model_format="DIFFUSERS_LORA")
    path = tmp_path / "out" / "lora.safetensors"
    keys = load_file(str(path))
    assert any(k.startswith("unet.") for k in keys) and any(k.startswith("text_encoder.") for k in keys)
    family, model, _ = our_model(config, lora_model_name=str(path))
    pipe = diffusers_pipeline("sd15")
    pipe.load_lora_weights(str(path))
    assert torch.allclose(latents(ours_pipeline(family, model), "a cat"), latents(pipe, "a cat"), atol=1e-4)


def test_kohya_text_encoder_names(tmp_path):
    train(tmp_path, method="LORA", text_encoder={"train": True}, epochs=1)
    keys = load_file(str(tmp_path / "out" / "lora.safetensors"))
    assert "lora_te_text_model_encoder_layers_0_self_attn_q_proj.lora_down.weight" in keys
    assert "lora_te_text_model_encoder_layers_11_mlp_fc2.lora_up.weight" in keys


@pytest.mark.parametrize(("variant", "fmt"), [("sd15", "ORIGINAL_SINGLE_FILE"), ("sd21", "DIFFUSERS")])
def test_finetune_trains_and_loads_in_diffusers(tmp_path, variant, fmt):
    destination = str(tmp_path / "out" / ("model.safetensors" if fmt != "DIFFUSERS" else "model"))
    config = train(
        tmp_path, variant=variant, method="FINE_TUNE", output_model_format=fmt, output_model_destination=destination,
        learning_rate=1e-4, text_encoder={"train": True},
    )  # fmt: skip
    assert_loss_trained(tmp_path, steps=4)
    family, model, _ = our_model(config, base_model_name=destination, training_method="FINE_TUNE")
    ours = latents(ours_pipeline(family, model), "a blue square")
    if fmt == "DIFFUSERS":
        from diffusers import StableDiffusionPipeline

        pipe = StableDiffusionPipeline.from_pretrained(destination, safety_checker=None)
    else:
        from diffusers import StableDiffusionPipeline

        pipe = StableDiffusionPipeline.from_single_file(
            destination, config=str(tiny_model_dir(variant)), local_files_only=True
        )
    assert torch.allclose(ours, latents(pipe, "a blue square"), atol=1e-4)
    assert not torch.allclose(ours, latents(diffusers_pipeline(variant), "a blue square"), atol=1e-4)  # it trained


@pytest.mark.parametrize("variant", ["sd15", "sd21"])
def test_embedding_trains_and_loads_in_diffusers(tmp_path, variant):
    config = train(tmp_path, variant=variant, method="EMBEDDING", placeholder="<shape>")
    assert_loss_trained(tmp_path, steps=4)
    path = tmp_path / "out" / "embedding.safetensors"
    tensors = load_file(str(path))
    width = {"sd15": 32, "sd21": 48}[variant]
    assert list(tensors) == ["emb_params"] and tuple(tensors["emb_params"].shape) == (2, width)

    family, model, method = our_model(config, embedding={**config["embedding"], "model_name": str(path)})
    ours = latents(ours_pipeline(family, model), method.embeddings.apply("a photo of <shape>"))
    pipe = diffusers_pipeline(variant)
    pipe.load_textual_inversion(str(path), token="<shape>")
    assert torch.allclose(ours, latents(pipe, "a photo of <shape>"), atol=1e-4)

    initial = our_model(config)[2].embeddings.embeddings[0].vectors["text_encoder"]
    assert not torch.allclose(initial.float(), tensors["emb_params"].float())  # the vectors trained


def test_embedding_without_placeholder_in_captions_warns(tmp_path, capsys):
    train(tmp_path, method="EMBEDDING", epochs=1, samples=[{"prompt": "a cat", "width": 64, "height": 64}])
    err = capsys.readouterr().err
    assert "no caption contains the embedding placeholder <shape>" in err
    assert "no sample prompt contains <shape>" in err


@pytest.mark.parametrize("bundle", [True, False])
def test_additional_embedding_with_lora(tmp_path, bundle):
    train(
        tmp_path, method="LORA", epochs=1, placeholder="<thing>", bundle_additional_embeddings=bundle,
        additional_embeddings=[{"placeholder": "<thing>", "token_count": 1, "initial_embedding_text": "shape",
                                "learning_rate": 1e-2}],
    )  # fmt: skip
    lora = load_file(str(tmp_path / "out" / "lora.safetensors"))
    separate = tmp_path / "out" / "lora_embeddings" / "thing.safetensors"
    if bundle:
        assert tuple(lora["bundle_emb.<thing>.emb_params"].shape) == (1, 32) and not separate.exists()
    else:
        assert not any(k.startswith("bundle_emb") for k in lora)
        assert tuple(load_file(str(separate))["emb_params"].shape) == (1, 32)
    scalars = read_scalars(tmp_path / "workspace" / "tensorboard")
    assert scalars["lr/embedding/<thing>"][-1][1] == pytest.approx(1e-2)


def test_masked_inpainting_finetune_trains(tmp_path):
    config = train(
        tmp_path, variant="sd15-inpainting", method="FINE_TUNE", masked_training=True, learning_rate=1e-4, epochs=1,
        output_model_destination=str(tmp_path / "out" / "inpaint.safetensors"),
    )  # fmt: skip
    assert_loss_trained(tmp_path, steps=2)
    _, model, _ = our_model(config, base_model_name=config["output_model_destination"])
    assert model.part("unet").config.in_channels == 9
