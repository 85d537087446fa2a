"""End to end on tiny SDXL 1.0 models (base and inpainting, the real topology at tiny width): train through the CLI's
`main(argv)`, then load what was written with diffusers' own loaders and check it gives the same latents as our code."""

from __future__ import annotations

import json
import math

import pytest
import torch
from PIL import Image
from safetensors import safe_open
from safetensors.torch import load_file

from onetrainer.cli.train import main
from onetrainer.config import config_from_dict
from onetrainer.config.enums import ModelFormat
from onetrainer.families.sdxl import StableDiffusionXLFamily
from onetrainer.methods import create_method
from onetrainer.tiny import tiny_model_dir
from tests.helpers import (
    assert_samples_are_pictures,
    image_folder,
    local_config,
    read_scalars,
    tiny_config,
    write_config,
)

CPU = torch.device("cpu")
PROMPT = "a red circle"


def train(root, count: int = 4, **overrides) -> dict:
    """Train through the CLI. Gradient checkpointing is off: on a CPU, recomputing only costs time."""
    image_folder(root, count=count, placeholder=overrides.pop("placeholder", None))
    no_checkpointing = {"gradient_checkpointing": False}
    defaults = {"variant": "sdxl", "epochs": 1, "unet": no_checkpointing}
    for part in ("text_encoder", "text_encoder_2"):
        defaults[part] = {**no_checkpointing, **overrides.pop(part, {})}
    config = tiny_config(root, **{**defaults, **overrides})
    assert main(["--config-path", str(write_config(root, config))]) == 0
    return config


def our_model(config: dict, **changes):
    """Our model with a written result applied, the way our own code loads it (continue / base-model paths)."""
    cfg, problems = config_from_dict({**config, **changes})
    assert [p for p in problems if p.is_error] == []
    family = StableDiffusionXLFamily()
    model = family.load(local_config(cfg))
    method = create_method(cfg, family, model, CPU)
    for module in model.parts.values():
        module.eval()
    return family, model, method


def ours_pipeline(family, model):
    from diffusers import DDIMScheduler

    return family.pipeline(model, DDIMScheduler.from_config(model.schedule.scheduler_config))


def diffusers_pipeline(variant: str = "sdxl"):
    from diffusers import StableDiffusionXLInpaintPipeline, StableDiffusionXLPipeline

    cls = StableDiffusionXLInpaintPipeline if variant.endswith("inpainting") else StableDiffusionXLPipeline
    return cls.from_pretrained(str(tiny_model_dir(variant)))


def latents(pipe, prompt: str = PROMPT, **kwargs) -> torch.Tensor:
    from diffusers import DDIMScheduler

    pipe.scheduler = DDIMScheduler.from_config(pipe.scheduler.config)
    pipe.set_progress_bar_config(disable=True)
    # One step keeps it fast: a step of the UNet with guidance sees every conditioning input.
    arguments = {"height": 64, "width": 64, "num_inference_steps": 1, "guidance_scale": 3.0, **kwargs}
    with torch.no_grad():
        return pipe(prompt, generator=torch.Generator().manual_seed(0), output_type="latent", **arguments).images


def assert_loss_trained(root, steps: int) -> dict:
    scalars = read_scalars(root / "workspace" / "tensorboard")
    losses = [v for _, v in scalars["loss/train_step"]]
    assert [s for s, _ in scalars["loss/train_step"]] == list(range(1, steps + 1))
    assert all(math.isfinite(v) for v in losses) and len(set(losses)) > 1
    return scalars


def log_text(root) -> str:
    return "".join(p.read_text(encoding="utf-8") for p in (root / "workspace" / "logs").glob("*.log"))


def test_lora_with_both_text_encoders_loads_in_diffusers(tmp_path):
    config = train(
        tmp_path, method="LORA", learning_rate=1e-3,
        text_encoder={"train": True, "learning_rate": 2e-3},
        text_encoder_2={"train": True, "learning_rate": 5e-4, "stop_training_after": 1,
                        "stop_training_after_unit": "STEP"},
        placeholder="<thing>", bundle_additional_embeddings=True,
        additional_embeddings=[{"placeholder": "<thing>", "token_count": 1, "initial_embedding_text": "shape"}],
    )  # fmt: skip
    scalars = assert_loss_trained(tmp_path, steps=2)
    assert scalars["lr/unet_lora"][-1][1] == pytest.approx(1e-3)
    assert scalars["lr/text_encoder_lora"][-1][1] == pytest.approx(2e-3)
    assert scalars["lr/text_encoder_2_lora"][-1][1] == pytest.approx(5e-4)
    assert "stopped training: text_encoder_2" in log_text(tmp_path)

    path = tmp_path / "out" / "lora.safetensors"
    weights = load_file(str(path))
    for name in (
        "lora_unet_input_blocks_4_1_transformer_blocks_0_attn1_to_q",
        "lora_unet_middle_block_1_transformer_blocks_0_ff_net_2",
        "lora_unet_output_blocks_0_0_in_layers_2",
        "lora_unet_label_emb_0_0",
        "lora_te1_text_model_encoder_layers_0_self_attn_q_proj",
        "lora_te2_text_model_encoder_layers_31_mlp_fc2",
    ):
        assert f"{name}.lora_down.weight" in weights and weights[f"{name}.alpha"].item() == 2.0, name
        assert weights[f"{name}.lora_up.weight"].abs().sum() > 0, name  # trained away from zero: it changes images
    assert not any(k.startswith(("lora_unet_down_blocks", "lora_te_")) for k in weights)
    assert tuple(weights.pop("bundle_emb.<thing>.clip_l").shape) == (1, 32)  # A1111 reads these; diffusers does not
    assert tuple(weights.pop("bundle_emb.<thing>.clip_g").shape) == (1, 64)
    with safe_open(str(path), "pt") as f:
        meta = f.metadata()
    assert meta["ss_base_model_version"] == "sdxl_base_v1-0"
    assert meta["modelspec.architecture"] == "stable-diffusion-xl-v1-base/lora"

    family, model, method = our_model(config, lora_model_name=str(path))
    pipe = diffusers_pipeline()
    pipe.load_lora_weights(weights)
    assert torch.allclose(latents(ours_pipeline(family, model)), latents(pipe), atol=1e-4)

    # The same adapters written in diffusers' format (what the trainer writes for DIFFUSERS_LORA), with clip skip:
    # diffusers' clip_skip counts from SDXL's penultimate layer for both encoders, as ours does.
    method.config.output_model_format = ModelFormat.DIFFUSERS_LORA
    diffusers_path = tmp_path / "out" / "lora-diffusers.safetensors"
    method.save_output(diffusers_path)
    assert {k.split(".")[0] for k in load_file(str(diffusers_path))} == {"unet", "text_encoder", "text_encoder_2"}
    assert (tmp_path / "out" / "lora-diffusers_embeddings" / "thing.safetensors").is_file()
    pipe = diffusers_pipeline()
    pipe.load_lora_weights(str(diffusers_path))
    for slot in model.text_encoders:
        slot.layer_skip = 1
    ours = latents(ours_pipeline(family, model), None, **family.prompt_arguments(model, PROMPT, None))
    assert torch.allclose(ours, latents(pipe, clip_skip=1), atol=1e-4)


def test_finetune_loads_in_diffusers_as_single_file_and_folder(tmp_path):
    destination = str(tmp_path / "out" / "model.safetensors")
    config = train(
        tmp_path, method="FINE_TUNE", learning_rate=1e-4, output_model_destination=destination,
        text_encoder={"train": True}, text_encoder_2={"train": True}, placeholder="<thing>",
        additional_embeddings=[{"placeholder": "<thing>", "token_count": 1, "initial_embedding_text": "shape"}],
    )  # fmt: skip
    assert_loss_trained(tmp_path, steps=2)
    extra = load_file(str(tmp_path / "out" / "model_embeddings" / "thing.safetensors"))
    assert {k: tuple(v.shape) for k, v in extra.items()} == {"clip_l": (1, 32), "clip_g": (1, 64)}
    assert "conditioner.embedders.1.model.transformer.resblocks.31.attn.in_proj_weight" in load_file(destination)

    family, model, _ = our_model(config, base_model_name=destination, additional_embeddings=[])
    ours = latents(ours_pipeline(family, model))
    from diffusers import StableDiffusionXLPipeline

    pipe = StableDiffusionXLPipeline.from_single_file(destination, config=str(tiny_model_dir("sdxl")),
                                                      local_files_only=True)  # fmt: skip
    assert torch.allclose(ours, latents(pipe), atol=1e-4)
    assert not torch.allclose(ours, latents(diffusers_pipeline()), atol=1e-4)  # it trained

    folder = tmp_path / "out" / "model-diffusers"
    family.save(model, ModelFormat.DIFFUSERS, folder, torch.float32)  # what DIFFUSERS output and backups write
    assert torch.allclose(ours, latents(StableDiffusionXLPipeline.from_pretrained(str(folder))), atol=1e-4)


def test_embedding_per_text_encoder_loads_in_diffusers(tmp_path):
    config = train(tmp_path, method="EMBEDDING", placeholder="<shape>", text_encoder_2={"train_embedding": False})
    assert_loss_trained(tmp_path, steps=2)
    path = tmp_path / "out" / "embedding.safetensors"
    tensors = load_file(str(path))
    assert {k: tuple(v.shape) for k, v in tensors.items()} == {"clip_l": (2, 32), "clip_g": (2, 64)}
    with safe_open(str(path), "pt") as f:
        assert f.metadata()["modelspec.architecture"] == "stable-diffusion-xl-v1-base/textual-inversion"

    family, model, method = our_model(config, embedding={**config["embedding"], "model_name": str(path)})
    initial = our_model(config)[2].embeddings.embeddings[0].vectors
    assert not torch.allclose(initial["text_encoder"].float(), tensors["clip_l"].float())  # trained
    assert torch.equal(initial["text_encoder_2"].float(), tensors["clip_g"].float())  # its switch was off
    ours = latents(ours_pipeline(family, model), method.embeddings.apply("a photo of <shape>"))
    pipe = diffusers_pipeline()
    pipe.load_textual_inversion(tensors["clip_l"], token="<shape>", text_encoder=pipe.text_encoder,
                                tokenizer=pipe.tokenizer)  # fmt: skip
    pipe.load_textual_inversion(tensors["clip_g"], token="<shape>", text_encoder=pipe.text_encoder_2,
                                tokenizer=pipe.tokenizer_2)  # fmt: skip
    assert torch.allclose(ours, latents(pipe, "a photo of <shape>"), atol=1e-4)


def test_inpainting_lora_with_cached_text_loads_in_diffusers(tmp_path):
    """Frozen text encoders: both encoders' hidden states and the pooled embedding come from the text cache."""
    config = train(
        tmp_path, count=2, variant="sdxl-inpainting", method="LORA", masked_training=True, latent_caching=True,
        layer_filter_preset="attn-only", text_encoder={"train": False}, text_encoder_2={"train": False},
    )  # fmt: skip
    assert "captions: " in log_text(tmp_path)  # the trainer filled the text cache
    path = tmp_path / "out" / "lora.safetensors"
    assert not any(k.startswith("lora_te") for k in load_file(str(path)))

    family, model, _ = our_model(config, lora_model_name=str(path))
    assert model.part("unet").config.in_channels == 9
    image = Image.new("RGB", (64, 64), (200, 40, 40))
    mask = Image.new("L", (64, 64), 0)
    mask.paste(255, (16, 16, 48, 48))
    ours = latents(ours_pipeline(family, model), image=image, mask_image=mask, strength=1.0)
    pipe = diffusers_pipeline("sdxl-inpainting")
    pipe.load_lora_weights(str(path))
    assert torch.allclose(ours, latents(pipe, image=image, mask_image=mask, strength=1.0), atol=1e-4)


def test_low_vram_preset_through_scripts_train_py(tmp_path):
    """The low-VRAM preset as shipped (fp16 weights, 8-bit AdamW, cached latents and text), only pointed at the tiny
    model and a small folder, through a real `scripts/train.py` process, with a sample (this is its run of
    tests/cli/test_presets_as_shipped.py)."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    image_folder(tmp_path, count=2)
    sample = {"prompt": "a red circle", "width": 64, "height": 64, "seed": 1, "diffusion_steps": 2}
    overrides = ["base_model_name=tiny:sdxl", "resolution=64", f"concepts.0.path={tmp_path / 'images'}", "epochs=1",
                 "tensorboard=false", "train_device=cpu", f"samples=[{json.dumps(sample)}]", "sample_after=1",
                 "sample_after_unit=EPOCH"]  # fmt: skip
    command = [sys.executable, str(root / "scripts" / "train.py"), "--preset", "sdxl/lora-low-vram"]
    for override in overrides:
        command += ["--set", override]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Finished (completed)" in result.stderr and "captions: 0 cached" in result.stderr
    assert "failed" not in result.stderr, result.stderr[-3000:]
    samples = [p for p in (tmp_path / "workspace").rglob("*") if p.suffix in (".png", ".jpg") and "samples" in p.parts]
    assert_samples_are_pictures(samples, result.stderr, "sdxl/lora-low-vram")
    path = tmp_path / "models" / "lora.safetensors"
    with safe_open(str(path), "pt") as f:
        keys, metadata = list(f.keys()), f.metadata()
    assert any(k.startswith("lora_unet_input_blocks_") for k in keys)
    assert metadata["ss_base_model_version"] == "sdxl_base_v1-0"
    assert metadata["modelspec.architecture"] == "stable-diffusion-xl-v1-base/lora"
